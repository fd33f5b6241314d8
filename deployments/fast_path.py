"""Serve's fast path (HAProxy on Serve's port in front of replicas that serve HTTP themselves) for
every way the app is started, not only ``make run``.

The switches are environment variables that Ray's processes read when they start
(`FAST_PATH_ENV`, checked against Ray 2.60's ``ray/serve/_private/constants.py``:
``RAY_SERVE_ENABLE_HA_PROXY`` turns HAProxy on and forces direct ingress;
``RAY_SERVE_THROUGHPUT_OPTIMIZED`` runs the app on the replica's main event loop). So they belong
to whatever starts Ray:

- ``make run``: the launcher (`deployments.launch`) sets them for its driver.
- ``serve run deployments:app`` (or ``deployments:build_app key=value ...``): Serve's CLI imports the
  app before it starts its local cluster, so `enable_for_serve_run` sets them then (unless the
  operator set them), with HAProxy's files in a private folder and its stats page and exporter on
  loopback, as ``make run`` has them (`deployments.haproxy_front`).
- ``serve run serve_config.yaml``, ``serve deploy`` and ``ray up cluster.yaml``: Ray starts (or has
  started) before any code of the app runs; the variables go on the command that starts Ray (the
  config's header, the cluster files' ``ray start`` lines). `missing_switches` names the ones a
  cluster lacks, and the ingress warns with it.

No Ray here: this runs before Ray starts.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import MutableMapping
from pathlib import Path

from deployments import haproxy_front
from deployments.idle_settings import idle_env
from deployments.private_folder import haproxy_files

FAST_PATH_ENV = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_HA_PROXY": "1"}
"""Direct ingress on the replicas, with HAProxy on Serve's port in front of them."""
HAPROXY_FILE_ENV = "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"
PRIVATE_FOLDER_PREFIX = "spout-serve-"


def missing_switches(environ: MutableMapping[str, str]) -> list[str]:
    """The fast path's variables that ``environ`` (a Ray process's: the cluster's) lacks or turns off."""
    return [name for name, value in FAST_PATH_ENV.items() if environ.get(name) != value]


def fast_path_warning(environ: MutableMapping[str, str]) -> str | None:
    """What to tell an operator whose cluster serves through Serve's proxy actor, or None."""
    missing = missing_switches(environ)
    if not missing:
        return None
    switches = " ".join(f"{name}=1" for name in FAST_PATH_ENV)
    return (
        f"Serve's fast path is off in this cluster ({', '.join(missing)} not 1): HTTP goes through Serve's proxy actor, "
        f"several times the egress CPU per token of HAProxy in front of the replicas. Start Ray with {switches} "
        "(`make run` does; see docs/deployment.md)"
    )


def is_serve_run(argv: list[str]) -> bool:
    """Whether this process is Serve's ``serve run`` command (which starts its local cluster after importing the app)."""
    return len(argv) >= 2 and Path(argv[0]).name == "serve" and argv[1] == "run"


def ray_started() -> bool:
    """Whether this process is connected to Ray already (without importing Ray when it is not loaded)."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def enable_for_serve_run(environ: MutableMapping[str, str] = os.environ, argv: list[str] = sys.argv) -> bool:
    """Under ``serve run``, before it starts Ray: the fast path's variables and `deployments.idle_settings`', unless the operator set
    them, and HAProxy's files in a private folder (removed when the command exits), unless the
    operator named them. True when it set anything. Elsewhere (a Ray worker building the app for
    ``serve deploy``, a test, a driver of one's own) it does nothing: the cluster's start decides."""
    if not is_serve_run(argv) or ray_started():
        return False
    changed = False
    for name, value in (FAST_PATH_ENV | idle_env(environ)).items():
        if name not in environ:
            environ[name] = value
            changed = True
    if environ.get("RAY_SERVE_ENABLE_HA_PROXY") == "1" and HAPROXY_FILE_ENV not in environ:
        folder = tempfile.mkdtemp(prefix=PRIVATE_FOLDER_PREFIX)  # mode 0700
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        environ.update(haproxy_files(folder) | haproxy_front.install(folder, haproxy_front.real_binary(dict(environ))))
        changed = True
    return changed
