"""`Exchange`: one request of the replica front's HTTP server (`deployments.http_server`) and its
response, as the ASGI app sees them: ``receive`` (the body as it comes, then the client's leaving),
``send`` (the head, sized or chunked bodies, written at once and waiting while the client's socket
is full), and the synchronous body writer an SSE stream writes its frames with
(`deployments.openai.event_stream.BodyWriter`). No Ray here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deployments.http_server import Connection

Scope = dict[str, Any]
Message = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]

BODY_HIGH_WATER_BYTES = 65_536
"""Reading pauses while this much of a request's body waits for the app."""
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 431: "Request Header Fields Too Large", 500: "Internal Server Error"}
logger = logging.getLogger(__name__)


def chunk(body: bytes) -> bytes:
    """``body`` as one chunk of a chunked response (``body`` not empty)."""
    return b"%x\r\n%b\r\n" % (len(body), body)


class Exchange:
    """One request and its response: the ASGI ``receive`` and ``send`` of the app's call."""

    def __init__(self, connection: Connection, scope: Scope, keep_alive: bool, expects_continue: bool) -> None:
        self.connection = connection
        self.scope = scope
        self.keep_alive = keep_alive
        self.expects_continue = expects_continue
        self.body: list[bytes] = []
        self.body_bytes = 0
        self.body_done = False
        """The parser read the whole body."""
        self.body_delivered = False
        """The app received the body's last message."""
        self.wakeup = asyncio.Event()
        self.disconnected = False
        self.started: Message | None = None
        self.chunked = False
        self.head_sent = False
        self.response_done = False

    # from the connection

    def body_received(self, body: bytes) -> None:
        self.body.append(body)
        self.body_bytes += len(body)
        if self.body_bytes > BODY_HIGH_WATER_BYTES and self.connection.transport is not None:
            self.connection.transport.pause_reading()
        self.wakeup.set()

    def body_complete(self) -> None:
        self.body_done = True
        self.wakeup.set()

    def client_left(self) -> None:
        self.disconnected = True
        self.wakeup.set()

    async def _wait(self, ready: Callable[[], bool]) -> None:
        while not ready():
            self.wakeup.clear()
            await self.wakeup.wait()

    # ASGI

    async def receive(self) -> Message:
        """The body's parts as they come, then ``http.disconnect`` once the client leaves or the response ends."""
        if not self.body_delivered and not self.disconnected:
            if self.expects_continue and not self.head_sent:
                self.expects_continue = False
                self.connection.write(CONTINUE)
            await self._wait(lambda: bool(self.body) or self.body_done or self.disconnected)
            if not self.disconnected:
                body, self.body, self.body_bytes = b"".join(self.body), [], 0
                self.body_delivered = self.body_done
                self.connection.body_taken(self)
                return {"type": "http.request", "body": body, "more_body": not self.body_done}
        await self._wait(lambda: self.disconnected or self.response_done)
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if self.disconnected or self.response_done:
            return  # the client left: nothing more reaches it
        if self.connection.server.queued_writes:
            self.connection.server.flush_writes()  # what write_now queued goes first
        if message["type"] == "http.response.start":
            if self.started is not None:
                raise RuntimeError("http.response.start sent twice")
            self.started = message
            return
        if message["type"] != "http.response.body" or self.started is None:
            raise RuntimeError(f"unexpected ASGI message {message['type']!r}")
        body: bytes = message.get("body", b"")
        more: bool = message.get("more_body", False)
        if self.head_sent and self.chunked and more:  # a streamed chunk: the hot path
            if body:
                self.connection.write(chunk(body))
                await self.connection.drained()
            return
        head = b"" if self.head_sent else self._head()
        if self.scope["method"] == "HEAD":
            body = b""
        if self.chunked:
            body = (chunk(body) if body else b"") + (b"" if more else b"0\r\n\r\n")
        self.connection.write(head + body)
        if more:
            await self.connection.drained()
        else:
            self._finish()

    def can_write_now(self) -> bool:
        """`deployments.openai.event_stream.BodyWriter`: a chunked body under way, its client there, its socket not full."""
        connection = self.connection
        return self.chunked and not self.disconnected and not self.response_done and connection.writable is None and not connection.lost

    def write_now(self, body: bytes) -> None:
        """A chunk of the body, when `can_write_now`: what ``send`` writes for it, without waiting; it goes
        out at the end of the event loop's turn, with the other responses' (`HttpServer.queue_write`)."""
        if body:
            self.connection.server.queue_write(self.connection, chunk(body))

    def _head(self) -> bytes:
        assert self.started is not None
        self.head_sent = True
        status = self.started["status"]
        headers = [(bytes(name).lower(), bytes(value)) for name, value in self.started.get("headers", [])]
        sized = any(name == b"content-length" for name, _ in headers)
        self.chunked = not sized and status not in (204, 304) and status >= 200 and self.scope["method"] != "HEAD"
        lines = [b"HTTP/1.1 %d %s\r\n" % (status, REASONS.get(status, "").encode())]
        lines += [name + b": " + value + b"\r\n" for name, value in headers if name != b"connection"]
        if self.chunked:
            lines.append(b"transfer-encoding: chunked\r\n")
        if not self.keep_alive or self.connection.closing:
            lines.append(b"connection: close\r\n")
        lines.append(b"\r\n")
        return b"".join(lines)

    def _finish(self) -> None:
        self.response_done = True
        self.wakeup.set()
        if not self.body_done:
            self.keep_alive = False  # the rest of the body was not read: the connection cannot be reused
        self.connection.exchange_done(self)

    async def run(self, app: ASGIApp) -> None:
        """The app's call; a response it did not finish ends the connection (after a 500 if nothing was sent)."""
        try:
            await app(self.scope, self.receive, self.send)
        except Exception:
            logger.exception("the app failed on %s %s", self.scope["method"], self.scope["path"])
        if not self.response_done:
            if self.started is None and not self.disconnected:
                self.connection.write(plain_response(500, "internal server error"))
            self.keep_alive = False
            self.response_done = True
            self.wakeup.set()
            self.connection.exchange_done(self)


def plain_response(status: int, message: str) -> bytes:
    body = message.encode() + b"\n"
    head = b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
    return head % (status, REASONS.get(status, "").encode(), len(body)) + body
