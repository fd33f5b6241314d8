"""The Ray driver `deployments.launch` runs: a local Ray cluster of its own, Serve's fast path, the app.

By default (``http_front=replica``) each ingress replica listens on ``host:port`` itself with
Spout's own HTTP server, and Serve starts no proxy. With ``http_front=serve``, HAProxy listens there
in front of the ingress replicas, each of which serves HTTP itself (Serve's direct ingress, with the
app on the replica's main event loop: ``RAY_SERVE_THROUGHPUT_OPTIMIZED``). Serve's own proxy actor,
which costs a Ray call per streamed frame, is on neither path. The Ray options are environment
variables that Ray's processes read when they start: the launcher sets them. The host is passed to
Serve explicitly: under HAProxy, Serve's default host would be every interface.

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
from deployments.config import ServeArgs
from deployments.launch import API_KEY_ENV, check_port, parse_args, replica_front
from deployments.processes import LAUNCH_ENV

APP_NAME = "spout"
READY_TIMEOUT_S = 900.0  # loading the model
CONTROLLER = ("SERVE_CONTROLLER_ACTOR", "serve")
LAUNCHER_CHECK_S = 1.0
DRAIN_POLL_S = 0.2


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


def replica_front_options(options: dict[str, str], host: str, port: int) -> dict[str, str]:
    """``options`` (a ``http_front=replica`` launch's) with the launcher's address as the replicas' own."""
    for key, value in (("http_host", host), ("http_port", str(port))):
        if key in options and options[key] != value:
            raise SystemExit(f"{key}={options[key]} differs from the launcher's address {host}:{port}: give the address with --host/--port")
    return {**options, "http_host": host, "http_port": str(port)}


def serve_app(app: Application, host: str, port: int, replica_front: bool, replica_ports: list[int]) -> None:
    """Deploys ``app`` and waits until it answers on ``host:port``: through HAProxy, or, with
    ``replica_front``, on the replicas' own servers, Serve's proxies off (no HAProxy, no proxy actor),
    each replica also alone on one of ``replica_ports``."""
    if replica_front:
        serve.start(proxy_location="Disabled")
    else:
        serve.start(http_options={"host": host, "port": port})
    serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
    base_url = f"http://{host}:{port}"
    wait_until_healthy(base_url, READY_TIMEOUT_S)
    if replica_front:
        alone = f"; each also alone on one of {replica_ports}, its rank's" if replica_ports else ""
        print(f"Spout serves on {base_url}/v1 (each ingress replica listens there itself{alone})", flush=True)
        return
    ports = direct_ingress_ports(APP_NAME, port)
    print(f"Spout serves on {base_url}/v1 (HAProxy on port {port} in front of the ingress replicas' own ports {ports})", flush=True)


def drain_replicas(timeout_s: float) -> None:
    """Delete the app, so that each ingress replica's own server (``http_front=replica``) takes no new
    connection and lets its streams end (`Ingress.__del__`); return once it is gone or after ``timeout_s``."""
    serve.delete(APP_NAME, _blocking=False)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and APP_NAME in serve.status().applications:
        time.sleep(DRAIN_POLL_S)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    front_is_replica = replica_front(args)
    options = options_with_api_key(args.options, os.environ)
    if front_is_replica:
        options = replica_front_options(options, args.host, args.port)
    app = build_app(options)  # invalid options fail here, before Ray starts
    replica_ports = list(ServeArgs.from_options(options, os.environ).own_ports()) if front_is_replica else []
    for port in replica_ports:
        check_port(args.host, port)
    ray.init(address="local")  # a cluster of its own, never one that ``ray start`` left running
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # after ray.init, which installs a handler that aborts
    serving = False
    try:
        serve_app(app, args.host, args.port, front_is_replica, replica_ports)
        serving = True
        wait_while_launcher_runs()
    finally:
        # Stopping now: the launcher's SIGTERM (it sees the raylet end) must not replace an error on
        # its way out with a silent SystemExit(0).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if serving and front_is_replica and args.drain_timeout_s > 0:
            drain_replicas(args.drain_timeout_s)
        ray.shutdown()


if __name__ == "__main__":
    main()
