"""`EventStream`: the ASGI response that streams SSE frames, with one plain task listening for the client leaving."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send


class EventStream(Response):
    """Sends each frame of ``frames`` as it comes, then ends the body.

    Starlette's ``StreamingResponse`` runs the body in an anyio task group beside a task
    that waits for the disconnect, and cancels the group when it comes: per request that
    machinery cost the ingress about as much CPU as four frames. Here one plain task waits
    for ``http.disconnect`` and calls ``on_disconnect`` at once, which must make ``frames``
    end soon (`EngineClient.disconnect` aborts the request and wakes its mailbox); nothing is
    sent after it. A response cut short another way (a failed send, a cancellation) calls
    ``on_disconnect`` too.
    """

    media_type = "text/event-stream"

    def __init__(self, frames: AsyncGenerator[str, None], on_disconnect: Callable[[], None]) -> None:
        self.frames = frames
        self.on_disconnect = on_disconnect
        self.status_code = 200
        self.background = None
        self.client_left = False
        self.init_headers()  # no body attribute, so no content-length

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        listener: asyncio.Task[None] | None = None
        ended = False
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            listener = asyncio.get_running_loop().create_task(self._listen(receive))
            async for frame in self.frames:
                if self.client_left:
                    break
                await send({"type": "http.response.body", "body": frame.encode(), "more_body": True})
            if not self.client_left:
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

    async def _listen(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.client_left = True
        self.on_disconnect()
