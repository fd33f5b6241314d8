"""HAProxy's runtime API on its admin socket, as the launcher uses it to drain ``make run`` before it stops.

Ray's template opens ``stats socket <RAY_SERVE_HAPROXY_SOCKET_PATH> level admin``; the launcher puts
that socket in its private folder (`deployments.private_folder`). Two commands:

- ``disable frontend http_frontend``: HAProxy stops accepting connections on the serving port (the
  port is released, as in a soft restart) while the streams it carries go on;
- ``show stat``: per proxy and server, among others ``scur``, the sessions now open; a backend's
  ``scur`` counts the requests being forwarded to the replicas (an idle client connection is not one).

No Ray, standard library only.
"""

from __future__ import annotations

import csv
import io
import socket

SERVING_FRONTEND = "http_frontend"
LOCAL_PROXIES = frozenset({"stats", "prometheus", SERVING_FRONTEND})
TIMEOUT_S = 5.0


def command(socket_path: str, line: str, timeout_s: float = TIMEOUT_S) -> str:
    """Send one command to HAProxy's admin socket; its whole answer (OSError when HAProxy is not there)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(socket_path)
        sock.sendall(line.encode() + b"\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def stop_accepting(socket_path: str) -> None:
    """New connections to the serving port are refused from now on; open ones go on."""
    command(socket_path, f"disable frontend {SERVING_FRONTEND}")


def requests_in_flight(stat_csv: str) -> int:
    """The requests HAProxy is forwarding to the replicas: the sum of the app backends' ``scur`` in ``show stat``'s CSV."""
    rows = csv.DictReader(io.StringIO(stat_csv.lstrip("# ")))
    return sum(int(row["scur"] or 0) for row in rows if row.get("svname") == "BACKEND" and row.get("pxname") not in LOCAL_PROXIES)


def in_flight(socket_path: str) -> int:
    return requests_in_flight(command(socket_path, "show stat"))
