"""`EventStream`: the ASGI response that streams SSE frames, with one plain task listening for the client leaving
(and pinging a silent stream, so that a proxy in front notices a client that left)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

PING_FRAME = b": ping\n\n"
"""An SSE comment: clients (the openai SDK too) skip it."""
PING_INTERVAL_S = 1.0


class EventStream(Response):
    """Sends each frame of ``frames`` as it comes, then ends the body.

    Starlette's ``StreamingResponse`` runs the body in an anyio task group beside a task
    that waits for the disconnect, and cancels the group when it comes: per request that
    machinery cost the ingress about as much CPU as four frames. Here one plain task waits
    for ``http.disconnect`` and calls ``on_disconnect`` at once, which must make ``frames``
    end soon (`EngineClient.disconnect` aborts the request and wakes its mailbox); nothing is
    sent after it. A response cut short another way (a failed send, a cancellation) calls
    ``on_disconnect`` too.

    A stream that has sent nothing for ``ping_interval_s`` (a request waiting in the engine's
    queue) gets a `PING_FRAME`. A proxy in front of the replica (HAProxy on ``make run``'s
    port) takes a client's closed connection for a half-close and passes nothing on until it
    writes to that client and is refused: only then does it close its connection to the
    replica, which is the disconnect the listener sees.
    """

    media_type = "text/event-stream"

    def __init__(self, frames: AsyncGenerator[str, None], on_disconnect: Callable[[], None], ping_interval_s: float = PING_INTERVAL_S) -> None:
        self.frames = frames
        self.on_disconnect = on_disconnect
        self.ping_interval_s = ping_interval_s
        self.status_code = 200
        self.background = None
        self.client_left = False
        self.frames_sent = 0
        self.body_ended = False
        self.init_headers()  # no body attribute, so no content-length

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        listener: asyncio.Task[None] | None = None
        ended = False
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            listener = asyncio.get_running_loop().create_task(self._listen(receive, send))
            async for frame in self.frames:
                if self.client_left:
                    break
                self.frames_sent += 1
                await send({"type": "http.response.body", "body": frame.encode(), "more_body": True})
            if not self.client_left:
                self.body_ended = True  # no ping after this
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                ended = True
        finally:
            if listener is not None:
                listener.cancel()
            if not ended and not self.client_left:
                # Cut short by a failed send or a cancellation, maybe before ``frames`` ever ran (so
                # its own cleanup would not): the request must not keep running for nobody.
                self.on_disconnect()
            await self.frames.aclose()

    async def _listen(self, receive: Receive, send: Send) -> None:
        receiving = asyncio.ensure_future(receive())
        try:
            seen = self.frames_sent
            while True:
                done, _ = await asyncio.wait((receiving,), timeout=self.ping_interval_s)
                if done:
                    if receiving.result()["type"] == "http.disconnect":
                        break
                    receiving = asyncio.ensure_future(receive())
                elif self.frames_sent == seen and not self.body_ended:
                    try:
                        await send({"type": "http.response.body", "body": PING_FRAME, "more_body": True})
                    except Exception:  # the connection is gone: the client left
                        break
                seen = self.frames_sent
        finally:
            receiving.cancel()
        self.client_left = True
        self.on_disconnect()
