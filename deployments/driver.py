"""The Ray driver `deployments.launch` runs: a local Ray cluster of its own, Serve's fast path, the app.

HAProxy listens on ``host:port`` in front of the ingress replicas, each of which serves HTTP
itself (Serve's direct ingress, with the app on the replica's main event loop:
``RAY_SERVE_THROUGHPUT_OPTIMIZED``). Serve's own proxy actor, which costs a Ray call per
streamed frame, is not on the path. The Ray options are environment variables that Ray's
processes read when they start: the launcher sets them. The host is passed to Serve
explicitly: under HAProxy, Serve's default host would be every interface.

It deploys ``build_app`` with the ``key=value`` options (and the API key, which it takes out of
its environment before Ray starts, so that no Ray process but the ingress replicas, through their
options, holds it), prints the address once the app answers there, and runs until SIGTERM (from the launcher) or until the launcher is gone; then it shuts
Ray down. The launcher ends whatever is left after that.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import MutableMapping

import httpx
import ray
from ray import serve
from ray.serve import Application

from deployments.app import build_app
from deployments.launch import API_KEY_ENV, parse_args
from deployments.processes import LAUNCH_ENV

APP_NAME = "spout"
READY_TIMEOUT_S = 900.0  # loading the model
CONTROLLER = ("SERVE_CONTROLLER_ACTOR", "serve")
LAUNCHER_CHECK_S = 1.0


def direct_ingress_ports(app_name: str, serve_port: int) -> list[int]:
    """The HTTP ports the app's ingress replicas listen on themselves (Serve's target groups as
    its proxy manager sees them: under HAProxy, other callers are given HAProxy's own port)."""
    controller = ray.get_actor(*CONTROLLER)
    groups = ray.get(controller.get_target_groups.remote(app_name, from_proxy_manager=True))
    return sorted({t.port for g in groups if g.protocol.value == "HTTP" for t in g.targets if t.port != serve_port})


def wait_until_healthy(base_url: str, timeout_s: float) -> None:
    """Poll ``/health`` (no key needed) until it answers 200; RuntimeError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base_url}/health", timeout=30).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"the app did not answer on {base_url} within {timeout_s:.0f} s")


def options_with_api_key(options: dict[str, str], environ: MutableMapping[str, str]) -> dict[str, str]:
    """``options`` with the API key moved out of ``environ`` (Ray's processes inherit the driver's
    environment; the key belongs to the ingress replicas alone)."""
    key = environ.pop(API_KEY_ENV, None)
    return options if key is None or "api_key" in options else {**options, "api_key": key}


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)


def wait_while_launcher_runs() -> None:
    """Return once the launcher that started this driver is gone (SIGTERM ends the wait sooner)."""
    launcher = int(os.environ[LAUNCH_ENV])
    while os.getppid() == launcher:
        time.sleep(LAUNCHER_CHECK_S)


def serve_app(app: Application, host: str, port: int) -> None:
    serve.start(http_options={"host": host, "port": port})
    serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
    base_url = f"http://{host}:{port}"
    wait_until_healthy(base_url, READY_TIMEOUT_S)
    ports = direct_ingress_ports(APP_NAME, port)
    print(f"Spout serves on {base_url}/v1 (HAProxy on port {port} in front of the ingress replicas' own ports {ports})", flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    app = build_app(options_with_api_key(args.options, os.environ))  # invalid options fail here, before Ray starts
    ray.init(address="local")  # a cluster of its own, never one that ``ray start`` left running
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # after ray.init, which installs a handler that aborts
    try:
        serve_app(app, args.host, args.port)
        wait_while_launcher_runs()
    finally:
        # Stopping now: the launcher's SIGTERM (it sees the raylet end) must not replace an error on
        # its way out with a silent SystemExit(0).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        ray.shutdown()


if __name__ == "__main__":
    main()
