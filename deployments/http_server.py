"""`HttpServer`: the ingress replica's own HTTP/1.1 server (``http_front=replica``), an ASGI server
on asyncio with `httptools`' parser (uvicorn's), listening on the public port itself.

Why not uvicorn behind HAProxy (Serve's fast path): per streamed SSE frame, HAProxy costs about
21 µs of CPU and uvicorn's send path with Serve's wrappers about 9 µs more than a frame written
straight to the transport (`bench.egress_floor`'s rows), while vLLM's whole API server spends
about 70 µs per token. Here a body chunk is one ``transport.write`` of the chunk's bytes, and the
replicas of a node share the port through ``SO_REUSEPORT`` (the kernel spreads connections among
them).

A response may also write body chunks without an ASGI message: each request's scope offers its
`Exchange` as a `deployments.openai.event_stream.BodyWriter` (``extensions``), so that an SSE stream's
frames are written from the loop that makes them, no task woken per frame. Those chunks wait until
the end of the event loop's turn and then go out together (`HttpServer.flush_writes`): the router
makes a whole step's frames, then the sends follow in one burst. Each send wakes a client, which on
a busy machine preempts the loop; with the sends after the step's work, that work runs on warm caches
(measured on 2 cores, two interleaved pairs of runs: the ingress 29.9 / 31.1 µs a token at 64 streams
against 34.8 / 37.2 with each frame sent as it was made, 33.0 / 33.0 against 34.8 / 36.6 at 256). An
ASGI ``send`` writes what is queued first, so a connection's bytes keep their order.

This module holds the listening side and each connection's parsing (`Connection`); each request
and its response, as the ASGI app sees them, is an `deployments.http_exchange.Exchange`.

What it does: HTTP/1.1 keep-alive (requests on a connection answered in order), chunked or
sized request bodies read with back-pressure, ``Expect: 100-continue``, chunked responses unless
the app sets ``content-length``, ``http.disconnect`` once the client leaves (or the response is
over), writes that wait while the client's socket is full. Bounded by `ServerLimits`: a request's
head must arrive whole within ``head_timeout_s`` of the connection being idle (keep-alive and
slow-loris both), a client whose socket takes nothing for ``write_timeout_s`` while a response waits
for it is cut off (a client that stops reading holds no stream for ever), at most
``max_header_bytes`` and ``max_headers`` (431 past them), at most ``max_connections`` open (new ones closed at once past it). A malformed request gets a 400 and the
connection closes. No TLS and no HTTP/2 or upgrades (WebSocket): put a terminating proxy in front.

No Ray here.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from dataclasses import dataclass
from urllib.parse import unquote

import httptools

from deployments.http_exchange import ASGIApp, Exchange, Scope, plain_response
from deployments.openai.event_stream import BODY_WRITER

BACKLOG = 4096
"""Connections the kernel holds for the server before it accepts them."""


@dataclass(frozen=True)
class ServerLimits:
    """What one connection may cost the server."""

    head_timeout_s: float = 10.0
    """A request's head must be whole within this long of the connection opening or its last response ending."""
    write_timeout_s: float = 60.0
    """A client whose socket takes nothing for this long while a response waits to be written is cut off."""
    max_header_bytes: int = 65_536
    max_headers: int = 100
    max_connections: int = 10_000


class HttpServer:
    """Serves ``app`` on ``host:port`` (``SO_REUSEPORT``: every replica of a node listens on it)."""

    def __init__(self, app: ASGIApp, limits: ServerLimits = ServerLimits()) -> None:
        self.app = app
        self.limits = limits
        self.connections: set[Connection] = set()
        self.servers: list[asyncio.Server] = []
        """One for each socket it serves on (the port the replicas share, and a replica's own)."""
        self.queued_writes: list[tuple[Connection, bytes]] = []
        """Body chunks written by `Exchange.write_now` this turn of the event loop, not sent yet."""
        self.port = 0
        """The port of the first socket it serves on, once started (the one given, or the one chosen for port 0)."""

    def queue_write(self, connection: Connection, data: bytes) -> None:
        """``data`` for ``connection``, written with the others at the end of the event loop's turn."""
        if not self.queued_writes:
            asyncio.get_running_loop().call_soon(self.flush_writes)
        self.queued_writes.append((connection, data))

    def flush_writes(self) -> None:
        """Write what `queue_write` holds, in order."""
        queued, self.queued_writes = self.queued_writes, []
        for connection, data in queued:
            connection.write(data)

    async def start(self, host: str, port: int) -> None:
        await self.serve(listening_socket(host, port))

    async def serve(self, sock: socket.socket) -> None:
        """Serves on ``sock`` (`listening_socket`'s) too; the connections of every socket share the limits."""
        self.servers.append(await asyncio.get_running_loop().create_server(lambda: Connection(self), sock=sock, backlog=BACKLOG))
        self.port = self.port or sock.getsockname()[1]

    def requests_in_flight(self) -> int:
        """Requests being answered or waiting on their connection to be (pipelined)."""
        return sum((connection.exchange is not None) + len(connection.queued) for connection in self.connections)

    def stop_accepting(self) -> None:
        """No new connection from now on (the port's other listeners take them); idle keep-alive
        connections close, and busy ones once their response ends."""
        for server in self.servers:
            server.close()
        for connection in list(self.connections):
            connection.closing = True
            if connection.exchange is None:
                connection.close()

    async def drain(self, timeout_s: float) -> None:
        """`stop_accepting`, then wait up to ``timeout_s`` for the open exchanges to end; close what is left."""
        self.stop_accepting()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.connections and loop.time() < deadline:
            await asyncio.sleep(0.05)
        for connection in list(self.connections):
            connection.close()


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` with ``SO_REUSEPORT``; OSError at once when a process
    that does not share the port holds it."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class Connection(asyncio.Protocol):
    """One client connection: parses requests and runs one `Exchange` at a time."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.limits = server.limits
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.addresses: tuple[tuple[str, int], tuple[str, int]] = (("", 0), ("", 0))
        """(this server's, the client's) address, read once per connection."""
        self.exchange: Exchange | None = None
        """The exchange being answered; later ones (pipelined) wait in ``queued``."""
        self.queued: deque[Exchange] = deque()
        self.parsing: Exchange | None = None
        """The request whose head or body the parser is reading."""
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.header_bytes = 0
        self.head_timer: asyncio.TimerHandle | None = None
        self.writable: asyncio.Future[None] | None = None
        self.write_timer: asyncio.TimerHandle | None = None
        """Armed while the client's socket is full (`ServerLimits.write_timeout_s`)."""
        self.closing = False
        self.lost = False
        self.refusal: tuple[int, str] | None = None
        """Why the parser was stopped: the status and message to answer with."""

    # asyncio's protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport subclasses
        if len(self.server.connections) >= self.limits.max_connections:
            transport.abort()
            return
        self.server.connections.add(self)
        self.addresses = (transport.get_extra_info("sockname")[:2], (transport.get_extra_info("peername") or ("", 0))[:2])
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:  # what a callback raised comes wrapped in one
            self._refuse(*(self.refusal or (400, "malformed HTTP request")))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.server.connections.discard(self)
        self._cancel_head_timer()
        self._cancel_write_timer()
        for exchange in (self.exchange, self.parsing, *self.queued):
            if exchange is not None:
                exchange.client_left()
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    def pause_writing(self) -> None:
        loop = asyncio.get_running_loop()
        self.writable = loop.create_future()
        self.write_timer = loop.call_later(self.limits.write_timeout_s, self._write_stalled)

    def resume_writing(self) -> None:
        self._cancel_write_timer()
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)
        self.writable = None

    def _cancel_write_timer(self) -> None:
        if self.write_timer is not None:
            self.write_timer.cancel()
            self.write_timer = None

    def _write_stalled(self) -> None:
        """The client took nothing for ``write_timeout_s``: cut it off (what waits to be written is dropped),
        which its exchange sees as the client leaving."""
        self.write_timer = None
        if self.transport is not None:
            self.transport.abort()

    # httptools' callbacks

    def on_message_begin(self) -> None:
        self.url, self.headers, self.header_bytes = b"", [], 0
        self._arm_head_timer()  # pipelined requests: each head has its own time

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        if len(self.headers) >= self.limits.max_headers:
            self._stop_parsing(431, "the request's head has too many headers")
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        if self.parser.should_upgrade():
            self._stop_parsing(400, "upgrades (WebSocket, h2c) are not served")
        url = httptools.parse_url(self.url)
        path = url.path.decode("latin-1")
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": self.parser.get_http_version(),
            "method": self.parser.get_method().decode("ascii"),
            "scheme": "http",
            "path": unquote(path) if "%" in path else path,
            "raw_path": url.path,
            "query_string": url.query or b"",
            "root_path": "",
            "headers": self.headers,
            "server": self.addresses[0],
            "client": self.addresses[1],
            "state": {},
        }
        keep_alive = self.parser.should_keep_alive()
        exchange = Exchange(self, scope, keep_alive, (b"expect", b"100-continue") in self.headers)
        scope["extensions"] = {BODY_WRITER: {"writer": exchange}}
        self.parsing = exchange
        if self.exchange is None:
            self._begin(exchange)
        else:
            self.queued.append(exchange)
            self.transport.pause_reading()  # one request ahead at most

    def on_body(self, body: bytes) -> None:
        if self.parsing is not None:
            self.parsing.body_received(body)

    def on_message_complete(self) -> None:
        if self.parsing is not None:
            self.parsing.body_complete()
            self.parsing = None

    # the connection's own work

    def _count_head(self, size: int) -> None:
        self.header_bytes += size
        if self.header_bytes > self.limits.max_header_bytes:
            self._stop_parsing(431, "the request's head is too large")

    def _stop_parsing(self, status: int, message: str) -> None:
        """Refuse the request being parsed: the parser raises what its callback raised, wrapped."""
        self.refusal = (status, message)
        raise RequestRefused(message)

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self.head_timer = asyncio.get_running_loop().call_later(self.limits.head_timeout_s, self.close)

    def _cancel_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _begin(self, exchange: Exchange) -> None:
        self.exchange = exchange
        asyncio.get_running_loop().create_task(exchange.run(self.server.app))

    def exchange_done(self, exchange: Exchange) -> None:
        """``exchange``'s response ended: the next request's turn, or the connection closes."""
        self.exchange = None
        if not exchange.keep_alive or self.closing or self.lost:
            self.close()
            return
        if self.queued:
            self._begin(self.queued.popleft())
        if self.transport is not None and not self.queued:
            self.transport.resume_reading()
            if self.exchange is None and self.parsing is None:
                self._arm_head_timer()

    def body_taken(self, exchange: Exchange) -> None:
        """The app took ``exchange``'s buffered body: reading goes on unless a later request waits."""
        if self.transport is not None and self.exchange is exchange and not self.queued:
            self.transport.resume_reading()

    def write(self, data: bytes) -> None:
        if not self.lost and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    async def drained(self) -> None:
        """Returns once the client's socket takes writes again (at once when it does)."""
        if self.writable is not None:
            await self.writable

    def _refuse(self, status: int, message: str) -> None:
        """A bad request's answer, unless a response is already under way; then the connection closes."""
        if self.exchange is None:
            self.write(plain_response(status, message))
        self.close()

    def close(self) -> None:
        self._cancel_head_timer()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class RequestRefused(Exception):
    """A request past `ServerLimits`' bounds, or one this server does not serve."""
