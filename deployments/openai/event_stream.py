"""`EventStream`: the ASGI response that streams SSE frames, with one plain task listening for the client leaving,
and the event loop's `Pinger`, which pings silent streams (so that a proxy in front notices a client that left).

A server that can write a response's body chunks without an ASGI message (Spout's own,
`deployments.http_server`) offers a `BodyWriter` in the scope's ``extensions`` under `BODY_WRITER`; an
`EventStream` given ``write_directly`` then lets its frames be written as they are made, from the
caller of `FrameSink.write`, with no task woken per frame.
"""

from __future__ import annotations

import asyncio
import contextvars
import weakref
from collections.abc import AsyncGenerator, Callable
from typing import Protocol

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

PING_FRAME = b": ping\n\n"
"""An SSE comment: clients (the openai SDK too) skip it."""
PING_INTERVAL_S = 1.0
BODY_WRITER = "spout.body_writer"
"""The ASGI extension (``scope["extensions"][BODY_WRITER]["writer"]``) of a server that offers a `BodyWriter`."""


class FinalFrame(str):
    """A stream's last frame: `EventStream` writes it with the end of the body, one write for both."""


class BodyWriter(Protocol):
    """A response body's synchronous writes, next to ASGI's ``send``."""

    def can_write_now(self) -> bool:
        """The head has gone, the client is there and its socket takes writes: `write_now` would not wait."""
        ...

    def write_now(self, body: bytes) -> None:
        """One chunk of the body, as ``send`` of an ``http.response.body`` with ``more_body`` would write it
        (at once, or queued to go out before anything ``send`` writes later)."""
        ...


class FrameSink(Protocol):
    """Where a stream's frames may be written without waiting (`EventStream`, over a `BodyWriter`)."""

    def ready(self) -> bool:
        """`write` would write the frame now, after every frame the stream sent."""
        ...

    def write(self, frame: str) -> None: ...


class EventStream(Response):
    """Sends each frame of ``frames`` as it comes, then ends the body.

    Starlette's ``StreamingResponse`` runs the body in an anyio task group beside a task
    that waits for the disconnect, and cancels the group when it comes: per request that
    machinery cost the ingress about as much CPU as four frames. Here one plain task waits
    for ``http.disconnect`` and calls ``on_disconnect`` at once, which must make ``frames``
    end soon (`EngineClient.disconnect` aborts the request and wakes its mailbox); nothing is
    sent after it. A response cut short another way (a failed send, a cancellation) calls
    ``on_disconnect`` too.

    With ``write_directly`` and a server that offers a `BodyWriter`, the stream is itself a
    `FrameSink`, handed to ``write_directly`` once the response has started: whoever makes frames may
    then write them at once (while `ready`), between the frames of ``frames``, which still ends the body.

    A stream that has sent nothing for ``ping_interval_s`` (a request waiting in the engine's
    queue) gets a `PING_FRAME` from the loop's `Pinger`: one task for all streams, so that a
    busy stream costs no timer. A proxy in front of the replica (HAProxy on ``make run``'s
    port) takes a client's closed connection for a half-close and passes nothing on until it
    writes to that client and is refused: only then does it close its connection to the
    replica, which is the disconnect the listener sees.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        frames: AsyncGenerator[str, None],  # its last may be a `FinalFrame`
        on_disconnect: Callable[[], None],
        ping_interval_s: float = PING_INTERVAL_S,
        write_directly: Callable[[FrameSink], None] | None = None,
    ) -> None:
        self.frames = frames
        self.on_disconnect = on_disconnect
        self.write_directly = write_directly
        self.body_writer: BodyWriter | None = None
        self.ping_interval_s = ping_interval_s
        self.status_code = 200
        self.background = None
        self.client_left = False
        self.frames_sent = 0
        self.body_ended = False
        self.send: Send | None = None
        self.ping_task: asyncio.Task[None] | None = None
        self.init_headers()  # no body attribute, so no content-length

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        listener: asyncio.Task[None] | None = None
        pinger = Pinger.of(self.ping_interval_s)
        ended = False
        self.send = send
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            listener = asyncio.get_running_loop().create_task(self._listen(receive))
            pinger.add(self)
            if self.write_directly is not None and (offered := scope.get("extensions", {}).get(BODY_WRITER)) is not None:
                self.body_writer = offered["writer"]
                self.write_directly(self)
            last = b""
            async for frame in self.frames:
                if self.client_left:
                    break
                self.frames_sent += 1
                if isinstance(frame, FinalFrame):
                    last = frame.encode()
                    break
                await send({"type": "http.response.body", "body": frame.encode(), "more_body": True})
            if not self.client_left:
                self.body_ended = True  # no ping after this
                await send({"type": "http.response.body", "body": last, "more_body": False})
                ended = True
        finally:
            self.body_writer = None
            pinger.remove(self)
            for task in (listener, self.ping_task):
                if task is not None:
                    task.cancel()
            if not ended and not self.client_left:
                # Cut short by a failed send or a cancellation, maybe before ``frames`` ever ran (so
                # its own cleanup would not): the request must not keep running for nobody.
                self.on_disconnect()
            await self.frames.aclose()

    def ready(self) -> bool:
        """`FrameSink.ready`: frames may be written now, from outside ``frames``."""
        return self.body_writer is not None and not self.client_left and not self.body_ended and self.body_writer.can_write_now()

    def write(self, frame: str) -> None:
        """`FrameSink.write`, when `ready`."""
        assert self.body_writer is not None
        self.frames_sent += 1
        self.body_writer.write_now(frame.encode())

    async def _listen(self, receive: Receive) -> None:
        """Waits for ``http.disconnect``: one pending receive, no timer."""
        while (await receive())["type"] != "http.disconnect":
            pass
        self._client_gone()

    def _client_gone(self) -> None:
        if not self.client_left:
            self.client_left = True
            self.on_disconnect()

    def ping(self) -> None:
        """Send a `PING_FRAME` (in a task of its own), unless the body ended or one is on its way."""
        if self.body_ended or self.client_left or (self.ping_task is not None and not self.ping_task.done()):
            return
        self.ping_task = asyncio.get_running_loop().create_task(self._ping())

    async def _ping(self) -> None:
        assert self.send is not None
        try:
            await self.send({"type": "http.response.body", "body": PING_FRAME, "more_body": True})
        except Exception:  # the connection is gone: the client left
            self._client_gone()


class Pinger:
    """One task per event loop and interval that pings the streams that sent nothing since its last
    tick, in place of a timer per stream; it runs while it has streams."""

    _of_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[float, Pinger]] = weakref.WeakKeyDictionary()

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.seen: dict[EventStream, int] = {}
        """Each stream's ``frames_sent`` at the last tick."""
        self.task: asyncio.Task[None] | None = None

    @classmethod
    def of(cls, interval_s: float) -> Pinger:
        """The running loop's pinger for ``interval_s``."""
        pingers = cls._of_loop.setdefault(asyncio.get_running_loop(), {})
        if interval_s not in pingers:
            pingers[interval_s] = cls(interval_s)
        return pingers[interval_s]

    def add(self, stream: EventStream) -> None:
        self.seen[stream] = stream.frames_sent
        if self.task is None:
            # An empty context, so that Ray does not cancel the pinger with the request that started it.
            self.task = asyncio.get_running_loop().create_task(self._run(), context=contextvars.Context())

    def remove(self, stream: EventStream) -> None:
        self.seen.pop(stream, None)

    async def _run(self) -> None:
        try:
            while self.seen:
                await asyncio.sleep(self.interval_s)
                for stream, seen in list(self.seen.items()):
                    if stream not in self.seen:
                        continue
                    if stream.frames_sent == seen:
                        stream.ping()
                    else:
                        self.seen[stream] = stream.frames_sent
        finally:
            self.task = None
