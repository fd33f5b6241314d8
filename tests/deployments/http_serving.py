"""Spout's HTTP server (`deployments.http_server`) run in-process on a free loopback port for a test,
and a raw exchange with it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from deployments.http_server import HttpServer, ServerLimits

WAIT_S = 10.0
HOST = "127.0.0.1"
DEFAULT_LIMITS = ServerLimits()


def run(app, test: Callable[[HttpServer], Awaitable[None]], limits: ServerLimits = DEFAULT_LIMITS) -> None:
    """Runs ``test`` against ``app`` served on a free loopback port."""

    async def main() -> None:
        server = HttpServer(app, limits)
        await server.start(HOST, 0)
        try:
            await asyncio.wait_for(test(server), WAIT_S)
        finally:
            await server.drain(0)

    asyncio.run(main())


async def exchange(port: int, raw: bytes) -> bytes:
    """Writes ``raw`` on a new connection and reads until the server closes it."""
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(raw)
    await writer.drain()
    data = await reader.read()
    writer.close()
    return data
