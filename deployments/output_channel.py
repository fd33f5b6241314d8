"""The engine's outputs to an ingress replica over a connection of their own, not a Ray call per step.

An ingress replica long-polls each engine once per step (`deployments.output_router`). As a Ray
actor call, a poll of one step's 64 outputs cost 670-685 µs of the caller's CPU and 870-880 µs of
the engine actor's, 1.5 ms of wall time, on this project's 2-core machine; over a TCP connection that
the engine actor serves on its event loop, 70 and 90 µs and 168 µs (``python -m bench.output_channel``).
At 16 streams the Ray call was more than the rest of a token's egress.

One connection per (ingress replica, engine); each frame is a 4-byte big-endian length, then the payload:

1. the replica sends a hello, JSON ``{"token": ..., "subscriber": ...}``. The token, drawn by the
   engine actor and handed out only through Ray (`EngineActor.output_channel`), is the connection's
   credential: without it the connection is closed before anything else is read;
2. then, in turn, the replica sends a poll, JSON ``{"timeout_s": ..., "aborts": [...]}``, and the engine
   answers with the `Polled` (pickled, as Ray would) once it has outputs or the timeout passed.

A connection that fails, times out or is cancelled mid-poll is dropped (a late answer on it would be
taken for the next poll's); the next poll asks the engine for its address again and reconnects, which
is also how a restarted engine actor is found.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import pickle
import secrets
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deployments.engine_actor import EngineHandle, Polled

logger = logging.getLogger(__name__)

LENGTH = struct.Struct(">I")
MAX_POLL_BYTES = 16 << 20
"""The most a replica's frame may hold (a poll's aborts: the streams a replica ended since its last poll)."""
MAX_POLLED_BYTES = 1 << 30
HELLO_TIMEOUT_S = 5.0
"""A connection that has not said who it is in this long is closed."""
MAX_POLL_TIMEOUT_S = 60.0

Poll = Callable[[str, float, list[str]], Awaitable["Polled"]]
"""``poll(subscriber, timeout_s, aborts)``: the engine's long poll (`EngineActor.get_outputs`)."""


class ChannelError(ConnectionError):
    """The other end broke the protocol: a frame too large or not what it should be."""


@dataclass(frozen=True)
class ChannelAddress:
    host: str
    port: int
    token: str


async def read_frame(reader: asyncio.StreamReader, max_bytes: int) -> bytes:
    (length,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
    if length > max_bytes:
        raise ChannelError(f"a frame of {length} bytes, above the {max_bytes} allowed")
    return await reader.readexactly(length)


def write_frame(writer: asyncio.StreamWriter, payload: bytes) -> None:
    writer.write(LENGTH.pack(len(payload)) + payload)


def parse_poll(payload: bytes) -> tuple[float, list[str]]:
    """A replica's poll frame: its timeout and aborts, checked."""
    request = json.loads(payload)
    timeout_s, aborts = request["timeout_s"], request["aborts"]
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not 0 <= timeout_s <= MAX_POLL_TIMEOUT_S:
        raise ChannelError(f"a poll's timeout_s must be a number of seconds in [0, {MAX_POLL_TIMEOUT_S:g}]")
    if not isinstance(aborts, list) or not all(isinstance(a, str) for a in aborts):
        raise ChannelError("a poll's aborts must be a list of request ids")
    return float(timeout_s), aborts


class ChannelServer:
    """The engine's side: serves ``poll`` to each replica that connects with the token, on ``host``."""

    def __init__(self, poll: Poll, host: str) -> None:
        self.poll = poll
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
        try:
            subscriber = await asyncio.wait_for(self._hello(reader), HELLO_TIMEOUT_S)
            if subscriber is None:
                return
            while True:
                timeout_s, aborts = parse_poll(await read_frame(reader, MAX_POLL_BYTES))
                polled = await self.poll(subscriber, timeout_s, aborts)
                write_frame(writer, pickle.dumps(polled, protocol=pickle.HIGHEST_PROTOCOL))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError, ValueError, KeyError, TypeError):
            pass  # the replica left or broke the protocol: its connection goes, the engine stays
        except Exception:
            logger.exception("an output channel's poll failed; its connection is closed")
        finally:
            self.connections.discard(writer)
            writer.close()

    async def _hello(self, reader: asyncio.StreamReader) -> str | None:
        """The subscriber a connection speaks for, or None when its token is wrong."""
        hello: Any = json.loads(await read_frame(reader, 4096))
        if not isinstance(hello, dict):
            return None
        token, subscriber = hello.get("token"), hello.get("subscriber")
        if not isinstance(token, str) or not hmac.compare_digest(token, self.token) or not isinstance(subscriber, str):
            return None
        return subscriber


class EngineChannel:
    """A replica's side, for one engine: `poll` as `EngineActor.get_outputs` answers it, over the connection."""

    def __init__(self, engine: EngineHandle, subscriber: str) -> None:
        self.engine = engine
        self.subscriber = subscriber
        self.connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def poll(self, timeout_s: float, aborts: list[str]) -> Polled:
        """The engine's outputs for this replica since its last poll; sends ``aborts`` with the poll.
        Raises what the connection or the engine's address lookup raised (the connection is then dropped)."""
        try:
            if self.connection is None:
                self.connection = await self._connect()
            reader, writer = self.connection
            write_frame(writer, json.dumps({"timeout_s": timeout_s, "aborts": aborts}).encode())
            return pickle.loads(await read_frame(reader, MAX_POLLED_BYTES))
        except BaseException:
            self.close()
            raise

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        address: ChannelAddress = await self.engine.output_channel.remote()
        reader, writer = await asyncio.open_connection(address.host, address.port)
        write_frame(writer, json.dumps({"token": address.token, "subscriber": self.subscriber}).encode())
        return reader, writer

    def close(self) -> None:
        if self.connection is not None:
            self.connection[1].close()
            self.connection = None
