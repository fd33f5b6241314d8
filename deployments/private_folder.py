"""What one ``make run`` keeps in a folder of its own, made with mode 0700 and removed when it stops,
and the environment variables that point Ray's processes there.

- HAProxy's config, its admin socket (Ray's template makes it mode 666, level admin) and state,
  instead of Ray's fixed paths under /tmp that any local user could read and use to redirect traffic;
  and the script Ray runs as HAProxy (`deployments.haproxy_front`: stats page and exporter on loopback).
- Ray's token (0600, new for each launch) with Ray's token authentication on: Ray's GCS, raylet,
  dashboard and workers refuse a client without it. The processes hold the token's path, not the token.
"""

from __future__ import annotations

import os
import secrets

from deployments import haproxy_front

HAPROXY_FILES = {"CONFIG_FILE_LOC": "haproxy.cfg", "SOCKET_PATH": "admin.sock", "SERVER_STATE_FILE": "server-state", "METRICS_SOCKET_PATH": "metrics.sock"}
RAY_TOKEN_FILE = "ray_token"
RAY_AUTH_MODE_ENV = "RAY_AUTH_MODE"
RAY_TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
RAY_TOKEN_ENV = "RAY_AUTH_TOKEN"
"""A token in the environment wins over the path in Ray; the launcher keeps it out of the driver's."""


def haproxy_files(folder: str) -> dict[str, str]:
    """HAProxy's config, admin socket and state in ``folder``."""
    paths = {f"RAY_SERVE_HAPROXY_{key}": os.path.join(folder, name) for key, name in HAPROXY_FILES.items()}
    return paths | {"RAY_SERVE_HAPROXY_SERVER_STATE_BASE": folder}


def ray_token(folder: str) -> dict[str, str]:
    """A new random token in ``folder`` (0600), and the variables that turn Ray's token authentication on with it."""
    path = os.path.join(folder, RAY_TOKEN_FILE)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(secrets.token_hex(32))
    return {RAY_AUTH_MODE_ENV: "token", RAY_TOKEN_PATH_ENV: path}


def private_environment(folder: str, environ: dict[str, str]) -> dict[str, str]:
    """``environ`` with every file of the launch in ``folder``, and Ray's token authentication on."""
    front = haproxy_front.install(folder, haproxy_front.real_binary(environ))
    inherited = {key: value for key, value in environ.items() if key != RAY_TOKEN_ENV}
    return inherited | haproxy_files(folder) | front | ray_token(folder)
