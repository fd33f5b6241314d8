"""``python -m deployments.launch [--host H] [--port P] [key=value ...]``: what ``make run`` runs.

Starts Ray and Serve with the fast path on the one advertised address: HAProxy listens on
``host:port`` (127.0.0.1:8000 unless told) in front of the ingress replicas, each of which
serves HTTP itself (Serve's direct ingress, with the app on the replica's main event loop:
``RAY_SERVE_THROUGHPUT_OPTIMIZED``). Serve's own proxy actor, which costs a Ray call per
streamed frame, is not on the path. It deploys ``build_app`` with the ``key=value`` options,
prints the address once the app answers there, and runs until interrupted.

The Ray options are environment variables that Ray's processes read when they start; when
they are missing the launcher runs itself again with them set. The host is passed to Serve
explicitly: under HAProxy, Serve's default host would be every interface.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import httpx
import ray
from ray import serve

from deployments.app import build_app
from deployments.ingress import kill_engines

FAST_PATH_ENV = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_HA_PROXY": "1"}
"""Direct ingress on the replicas, with HAProxy on Serve's port in front of them."""
APP_NAME = "spout"
READY_TIMEOUT_S = 900.0  # loading the model
CONTROLLER = ("SERVE_CONTROLLER_ACTOR", "serve")


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


def parse_options(pairs: list[str]) -> dict[str, str]:
    """``["model=tiny-random", ...]`` -> ``{"model": "tiny-random", ...}``, as ``serve run`` takes them."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"options are key=value, not {pair!r}")
        options[key] = value
    return options


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    missing = {name: value for name, value in FAST_PATH_ENV.items() if os.environ.get(name) != value}
    if missing:  # Ray's processes read these when they start: run again with them set
        os.execve(sys.executable, [sys.executable, "-m", "deployments.launch", *argv], os.environ | missing)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1", help="the address to serve on (0.0.0.0: every interface)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("options", nargs="*", help="build_app options as key=value")
    args = parser.parse_args(argv)
    app = build_app(parse_options(args.options))
    ray.init()
    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
    base_url = f"http://{args.host}:{args.port}"
    wait_until_healthy(base_url, READY_TIMEOUT_S)
    ports = direct_ingress_ports(APP_NAME, args.port)
    print(f"Spout serves on {base_url}/v1 (HAProxy on port {args.port} in front of the ingress replicas' own ports {ports})", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:  # Serve keeps a replica's port for 30 s after it stops, for load balancers
        serve.shutdown()
        kill_engines(APP_NAME)


if __name__ == "__main__":
    main()
