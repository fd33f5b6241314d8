"""An ingress replica's calls to an engine (its long poll, adds and aborts) on connections of their own, not Ray calls.

An ingress replica long-polls each engine once per step (`deployments.output_router`) and adds and
aborts requests in one call per event-loop tick (`deployments.tick_batcher`). As a Ray actor call, a
poll of one step's 64 outputs cost 670-685 µs of the caller's CPU and 870-880 µs of the engine
actor's, 1.5 ms of wall time, on this project's 2-core machine; over a TCP connection that the engine
actor serves on its event loop, 70 and 90 µs and 168 µs (``python -m bench.engine_channel``). At 16
streams the Ray call was more than the rest of a token's egress; a request's add, one more such call,
was on the way to its first token.

Each frame is a 4-byte big-endian length, then the payload:

1. the replica sends a hello, JSON ``{"token": ...}``. The token, drawn by the engine actor and handed
   out only through Ray (`EngineActor.channel_address`), is the connection's credential: without it
   the connection is closed before anything else is read, so nothing a stranger sends is unpickled;
2. then, in turn, the replica sends a call, a pickled `ChannelCall` naming one of the methods the
   engine serves, and the engine answers with its pickled `CallReply` once the method returns (a long
   poll once it has outputs or its timeout passed). A call that raised answers with the error's text.

The replica keeps one connection for its polls and a few for its other calls, one call on a
connection at a time. A connection that fails, times out or is cancelled mid-call is dropped (a late
answer on it would be taken for the next call's); the next call asks the engine for its address again
and reconnects, which is also how a restarted engine actor is found.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import pickle
import secrets
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deployments.engine_actor import EngineHandle, Polled

logger = logging.getLogger(__name__)

LENGTH = struct.Struct(">I")
MAX_HELLO_BYTES = 4096
MAX_FRAME_BYTES = 1 << 30
HELLO_TIMEOUT_S = 5.0
"""A connection that has not shown its token in this long is closed."""
KEEPALIVE = (
    (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
    (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 30),
    (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 10),
    (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3),
)
"""TCP keepalive on the engine's side of each connection: a replica whose node died (no FIN, no reset)
is found within about a minute and its connection closed, not kept for as long as the engine lives."""

Method = Callable[..., Awaitable[Any]]


class EngineMethod(StrEnum):
    """The engine's methods a replica calls on the channel, by the name a `ChannelCall` carries."""

    GET_OUTPUTS = "get_outputs"
    """The long poll (`EngineActor.get_outputs`), on a connection of its own."""
    ADD_REQUESTS = "add_requests"
    ABORT_REQUESTS = "abort_requests"


class ChannelError(ConnectionError):
    """The connection broke, or the other end broke the protocol: the engine is taken as unreachable."""


class EngineCallError(Exception):
    """The engine's method raised: the connection is fine, the call failed (its error's text)."""


@dataclass(frozen=True)
class ChannelAddress:
    host: str
    port: int
    token: str


@dataclass(frozen=True)
class ChannelCall:
    method: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class CallReply:
    result: Any = None
    error: str | None = None


async def read_frame(reader: asyncio.StreamReader, max_bytes: int) -> bytes:
    (length,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
    if length > max_bytes:
        raise ChannelError(f"a frame of {length} bytes, above the {max_bytes} allowed")
    return await reader.readexactly(length)


def write_frame(writer: asyncio.StreamWriter, payload: bytes) -> None:
    writer.write(LENGTH.pack(len(payload)) + payload)


class ChannelServer:
    """The engine's side: serves ``methods`` (by name) to each replica that connects with the token, on ``host``."""

    def __init__(self, methods: dict[EngineMethod, Method], host: str) -> None:
        self.methods = methods
        self.host = host
        self.token = secrets.token_hex(32)
        self.server: asyncio.Server | None = None
        self.connections: set[asyncio.StreamWriter] = set()

    async def address(self) -> ChannelAddress:
        """Where replicas connect; the server starts listening on the first call."""
        if self.server is None:
            self.server = await asyncio.start_server(self._serve, self.host, 0)
        port = self.server.sockets[0].getsockname()[1]
        return ChannelAddress(self.host, port, self.token)

    def close(self) -> None:
        """Stop listening and drop every connection."""
        if self.server is not None:
            self.server.close()
        for writer in list(self.connections):
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections.add(writer)
        connection = writer.get_extra_info("socket")
        for level, option, value in KEEPALIVE:
            connection.setsockopt(level, option, value)
        try:
            if not await asyncio.wait_for(self._hello(reader), HELLO_TIMEOUT_S):
                return
            while True:
                call = pickle.loads(await read_frame(reader, MAX_FRAME_BYTES))
                method = self.methods.get(call.method) if isinstance(call, ChannelCall) else None
                if method is None:
                    return  # not a call this engine serves: the replica is not speaking this protocol
                try:
                    reply = CallReply(await method(*call.args))
                except Exception as error:  # the call's own failure: its caller gets the text, the connection stays
                    logger.warning("a channel call to %s failed", call.method, exc_info=error)
                    reply = CallReply(error=f"{type(error).__name__}: {error}")
                write_frame(writer, pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass  # the replica left, or a stranger did not show the token in time
        except Exception as error:  # a frame that is not this protocol's: its connection goes, the engine stays
            logger.warning("closing a channel connection that broke the protocol: %r", error)
        finally:
            self.connections.discard(writer)
            writer.close()

    async def _hello(self, reader: asyncio.StreamReader) -> bool:
        """Whether a connection's hello carries the token."""
        try:
            hello: Any = json.loads(await read_frame(reader, MAX_HELLO_BYTES))
        except ValueError:
            return False
        token = hello.get("token") if isinstance(hello, dict) else None
        return isinstance(token, str) and hmac.compare_digest(token, self.token)


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class EngineChannel:
    """A replica's side, for one engine: `poll` (`EngineActor.get_outputs`) on a connection of its own, and
    `call` for the engine's other methods on connections kept for reuse."""

    def __init__(self, engine: EngineHandle, subscriber: str) -> None:
        self.engine = engine
        self.subscriber = subscriber
        self.polling: Connection | None = None
        self.idle: list[Connection] = []
        """Connections with no call on them."""

    async def poll(self, timeout_s: float, aborts: list[str]) -> Polled:
        """The engine's outputs for this replica since its last poll; sends ``aborts`` with the poll.
        Raises what the connection or the engine's address lookup raised (the connection is then dropped)."""
        try:
            if self.polling is None:
                self.polling = await self._connect()
            return await self._exchange(self.polling, ChannelCall(EngineMethod.GET_OUTPUTS, (self.subscriber, timeout_s, aborts)))
        except BaseException:
            self.close()  # the other calls' connections go too: a failed poll is most often a restarted engine
            raise

    async def call(self, method: EngineMethod, *args: Any) -> Any:
        """The engine's ``method(*args)``: its result, `EngineCallError` if it raised, or what the
        connection raised (`ChannelError`, or the address lookup's error while the engine restarts)."""
        connection = self.idle.pop() if self.idle else await self._connect()
        try:
            result = await self._exchange(connection, ChannelCall(method, args))
        except EngineCallError:
            self.idle.append(connection)
            raise
        except BaseException:
            connection[1].close()
            raise
        self.idle.append(connection)
        return result

    async def _exchange(self, connection: Connection, call: ChannelCall) -> Any:
        reader, writer = connection
        write_frame(writer, pickle.dumps(call, protocol=pickle.HIGHEST_PROTOCOL))
        try:
            reply: CallReply = pickle.loads(await read_frame(reader, MAX_FRAME_BYTES))
        except asyncio.IncompleteReadError as error:
            raise ChannelError("the engine closed the connection") from error
        if reply.error is not None:
            raise EngineCallError(reply.error)
        return reply.result

    async def _connect(self) -> Connection:
        address: ChannelAddress = await self.engine.channel_address.remote()
        try:
            reader, writer = await asyncio.open_connection(address.host, address.port)
        except OSError as error:  # refused, unreachable: the engine is gone, as a broken connection says
            raise ChannelError(f"cannot reach the engine's channel at {address.host}:{address.port}: {error}") from error
        write_frame(writer, json.dumps({"token": address.token}).encode())
        return reader, writer

    def close(self) -> None:
        """Drop every connection."""
        if self.polling is not None:
            self.polling[1].close()
            self.polling = None
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()
