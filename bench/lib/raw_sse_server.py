"""The floor under any SSE server's CPU per frame: a bare asyncio protocol that parses a request's head
with httptools and writes chunked SSE frames to the transport, with no ASGI, no response object and no
generator; `bench.egress_floor`'s reference for what a frame costs the kernel and the event loop.

Two ways to reach the streams each simulated step (``STEP_S``):

- ``task``: a task per stream wakes on an event each step and writes its frame (what an ASGI
  server's response does, with one task per request);
- ``step``: the step's own loop writes every stream's frame, with no task woken per stream (what
  an ingress that writes frames from its per-step routing would do).
"""

from __future__ import annotations

import asyncio
import socket

import httptools
import uvloop

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
END = b"0\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


class Streams:
    """The open streams of one server and the frames each is sent: ``frames - 1`` of ``frame``, then ``last``."""

    def __init__(self, mode: str, frame: bytes, last: bytes, frames: int) -> None:
        self.mode = mode
        self.frames = [chunk(frame)] * (frames - 1) + [chunk(last) + END]
        self.sent: dict[asyncio.Transport, int] = {}
        """``step``: each stream's transport and the frames it was sent."""
        self.wakeups: set[asyncio.Event] = set()
        """``task``: each stream's task waits on one."""

    def frame(self, index: int) -> bytes:
        return (HEAD if index == 0 else b"") + self.frames[index]

    def step(self) -> None:
        if self.mode == "task":
            for wakeup in list(self.wakeups):
                wakeup.set()
            return
        for transport, index in list(self.sent.items()):
            transport.write(self.frame(index))
            if index + 1 == len(self.frames):
                del self.sent[transport]
            else:
                self.sent[transport] = index + 1

    async def stream(self, transport: asyncio.Transport) -> None:
        wakeup = asyncio.Event()
        self.wakeups.add(wakeup)
        try:
            for index in range(len(self.frames)):
                await wakeup.wait()
                wakeup.clear()
                transport.write(self.frame(index))
        finally:
            self.wakeups.discard(wakeup)


class RawSse(asyncio.Protocol):
    def __init__(self, streams: Streams) -> None:
        self.streams = streams
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        assert self.transport is not None
        if self.streams.mode == "step":
            self.streams.sent[self.transport] = 0
        else:
            asyncio.get_running_loop().create_task(self.streams.stream(self.transport))


def serve_forever(host: str, port: int, streams: Streams, step_s: float) -> None:
    """Serve on uvloop until killed, stepping every ``step_s``."""
    uvloop.install()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await loop.create_server(lambda: RawSse(streams), host, port)
        while True:
            await asyncio.sleep(step_s)
            streams.step()

    asyncio.run(main())
