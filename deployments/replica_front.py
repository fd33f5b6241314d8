"""An ingress replica's own HTTP server (``http_front=replica``): the ports it listens on.

Every ingress replica of a node listens on ``http_port`` (``SO_REUSEPORT``: the kernel spreads new
connections among them), and each also listens alone on ``http_own_port_min`` plus its rank on the
node (`ReplicaRank.local_rank`), so that a scrape of ``/metrics`` there reaches that one replica,
as each replica's own port does behind HAProxy. A replica that drains stops listening on both, so a
replica taking its rank's place may bind the own port before the old one has gone.

A port held by a process other than the app's ingress replicas fails the replica's start with the
holder named: HAProxy, which Serve puts on its own port, sets ``SO_REUSEPORT`` as the replicas do and
would otherwise take a share of the connections silently.
"""

from __future__ import annotations

import asyncio
import contextvars
import socket

from deployments.config import ServeArgs
from deployments.http_exchange import ASGIApp
from deployments.http_server import HttpServer, listening_socket
from deployments.processes import describe, other_listeners


def check_port(port: int, app_name: str) -> None:
    """OSError when a process other than the app's ingress replicas listens on ``port``."""
    if others := other_listeners(port, f"ServeReplica:{app_name}:Ingress"):
        raise OSError(
            f"port {port} is held by {', '.join(describe(p) for p in others)}: with http_front=replica the ingress replicas listen there "
            "themselves; give them a port of their own (http_port, http_own_port_min), or start Serve without proxies (proxy_location: Disabled)"
        )


def start_replica_front(app: ASGIApp, args: ServeArgs, app_name: str, local_rank: int) -> tuple[HttpServer, asyncio.Task[None]]:
    """The replica's server on the shared port and its own, and the task that starts it. The ports
    are bound here, so that a held one fails the replica's start."""
    server = HttpServer(app, args.server_limits())
    sockets = []
    for port in (args.http_port, args.own_port(local_rank)):
        if port is not None:
            check_port(port, app_name)
            sockets.append(listening_socket(args.http_host, port))
    serving = asyncio.get_running_loop().create_task(serve_all(server, sockets), context=contextvars.Context())
    return server, serving


async def serve_all(server: HttpServer, sockets: list[socket.socket]) -> None:
    for sock in sockets:
        await server.serve(sock)
