"""``python -m deployments.launch [--host H] [--port P] [key=value ...]``: what ``make run`` runs.

The launcher stays small and imports no Ray: it starts the Ray driver (`deployments.driver`)
in a session of its own, marked with ``SPOUT_LAUNCH=<the launcher's pid>`` (`deployments.processes`),
and stops everything that carries the mark however it is told to stop:

- SIGINT (Ctrl-C: the terminal's signal reaches only the launcher, the driver is in its own
  session), SIGTERM or SIGHUP: first the drain: HAProxy stops accepting connections and the
  requests it forwards (streams included) run to their end, for up to ``--drain-timeout-s``
  (`DRAIN_TIMEOUT_S`; 0: no drain; `deployments.haproxy_admin`). With ``http_front=replica`` (no
  HAProxy) the driver drains instead: it deletes the app, whose ingress replicas stop listening and
  let their streams end. Then the driver shuts Ray down (up to `DRIVER_GRACE_S`), then whatever still carries the mark gets SIGTERM and,
  `processes.TERM_GRACE_S` later, SIGKILL. A second signal skips the drain and the wait for the driver.
- The driver exits or Ray's GCS or raylet ends (``ray stop``, a crash): the same sweep, then the
  launcher exits with status 1.

The launch's files (HAProxy's config and socket, Ray's token) are in a folder of its own, mode 0700,
removed at the end (`deployments.private_folder`); Ray runs with token authentication on.

Before it starts anything it ends the processes an earlier launcher left (marked, their launcher
gone), and checks that its ports are free: a port in use is a one-line error that names the
process holding it and what to do.
"""

from __future__ import annotations

import argparse
import glob
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import psutil

from deployments import haproxy_admin, haproxy_front
from deployments.fast_path import FAST_PATH_ENV
from deployments.idle_settings import idle_env
from deployments.private_folder import haproxy_files, private_environment
from deployments.processes import (
    LAUNCH_ENV,
    Launch,
    describe,
    end_processes,
    ephemeral_ports,
    find_launches,
    marked_processes,
    port_holders,
    port_is_free,
    process_environ,
    process_name,
    taken_port_ranges,
)

HAPROXY_PORTS = {"RAY_SERVE_HAPROXY_STATS_PORT": 8404, "RAY_SERVE_HAPROXY_METRICS_PORT": 9101}
"""HAProxy's stats page and Prometheus exporter: the variables Ray reads and its defaults. Both bind
loopback (`haproxy_front`; Ray's template binds them on every interface)."""
DRIVER_MODULE = "deployments.driver"
PRIVATE_FOLDER_PREFIX = "spout-run-"
DRIVER_GRACE_S = 15.0
DRAIN_TIMEOUT_S = 30.0
"""How long a stop waits for the requests in flight by default (as a Kubernetes pod's default grace period)."""
DRAIN_POLL_S = 0.2
WATCH_INTERVAL_S = 0.5
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
API_KEY_ENV = "SPOUT_API_KEY"
"""The environment variable the API key comes from (`deployments.config.ServeArgs`)."""
VITAL_RAY_PROCESSES = frozenset({"gcs_server", "raylet"})
DEFAULT_FRONT = "replica"
"""``make run``'s ``http_front``: each ingress replica serves the launch's port itself, no HAProxy
(``http_front=serve`` puts HAProxy in front of uvicorn in each replica). Serve's own entry points
(``serve run``, ``serve deploy``) keep ``serve``, the option's default: Serve's proxies hold the port there."""


@dataclass(frozen=True)
class LaunchArgs:
    host: str
    port: int
    options: dict[str, str]
    allow_unauthenticated: bool = False
    drain_timeout_s: float = DRAIN_TIMEOUT_S


def parse_options(pairs: list[str]) -> dict[str, str]:
    """``["model=tiny-random", ...]`` -> ``{"model": "tiny-random", ...}``, as ``serve run`` takes them."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"options are key=value, not {pair!r}")
        options[key] = value
    return options


def parse_args(argv: list[str]) -> LaunchArgs:
    parser = argparse.ArgumentParser(prog="python -m deployments.launch", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1", help="the address to serve on (0.0.0.0: every interface)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--allow-unauthenticated", action="store_true", help="serve an address other machines can reach without an API key")
    parser.add_argument(
        "--drain-timeout-s", type=float, default=DRAIN_TIMEOUT_S, help="on a stop signal, how long the requests in flight may run to their end (0: none)"
    )
    parser.add_argument("options", nargs="*", help="build_app options as key=value")
    args = parser.parse_args(argv)
    if args.drain_timeout_s < 0:
        parser.error("--drain-timeout-s must be at least 0")
    options = {"http_front": DEFAULT_FRONT} | parse_options(args.options)
    return LaunchArgs(args.host, args.port, options, args.allow_unauthenticated, args.drain_timeout_s)


def check_authenticated(args: LaunchArgs, environ: dict[str, str]) -> None:
    """SystemExit when the server would answer other machines without an API key, unless the operator said so."""
    if is_loopback(args.host) or args.options.get("api_key") or environ.get(API_KEY_ENV) or args.allow_unauthenticated:
        return
    raise SystemExit(
        f"--host {args.host} serves other machines, and no API key is set: set {API_KEY_ENV} (e.g. `{API_KEY_ENV}=... make run HOST={args.host}`), "
        "or pass --allow-unauthenticated to serve everyone who can reach it"
    )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def replica_front(args: LaunchArgs) -> bool:
    """Whether the ingress replicas serve the launch's address themselves (``http_front=replica``): no HAProxy."""
    return args.options.get("http_front") == "replica"


def listening_ports(args: LaunchArgs) -> dict[int, str]:
    """The fixed ports a launch listens on (port -> the address it binds); the replicas' own
    ports and Ray's are chosen free when they start."""
    if replica_front(args):
        return {args.port: args.host}
    haproxy = {int(os.environ.get(name, default)): haproxy_front.LOCAL_HOST for name, default in HAPROXY_PORTS.items()}
    return haproxy | {args.port: args.host}


def say(line: str) -> None:
    """Print a line; a terminal that has closed (SIGHUP) must not stop the launcher from stopping."""
    try:
        print(line, flush=True)
    except OSError:
        pass


class StopSignals:
    """Counts SIGINT, SIGTERM and SIGHUP instead of dying of them; the first one's name says why."""

    def __init__(self) -> None:
        self.count = 0
        self.first: str | None = None
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._received)

    def _received(self, signum: int, frame: object) -> None:
        self.count += 1
        self.first = self.first or signal.Signals(signum).name


def clear_stale_launches() -> None:
    """End what earlier launchers left running (marked processes whose launcher is gone)."""
    for launch in find_launches():
        if not launch.launcher_alive:
            _clear(launch)


def _clear(launch: Launch) -> None:
    left = end_processes(launch.processes)
    if left:
        raise SystemExit(f"processes an earlier Spout left could not be ended: {', '.join(describe(p) for p in left)}; end them with `kill -9`")
    say(f"Ended {len(launch.processes)} processes an earlier Spout (launcher pid {launch.launcher_pid}) left running: {launch.names()}")


def check_port(host: str, port: int) -> None:
    """SystemExit with one line that names who holds ``port`` and what to do, unless it is free."""
    if port_is_free(host, port):
        return
    holders = port_holders(port)
    if any(LAUNCH_ENV in process_environ(p) for p in holders):
        raise SystemExit(f"port {port} is held by a running Spout ({describe(holders[0])}): stop it with `make stop` (or Ctrl-C where it runs)")
    who = f" by {', '.join(describe(p) for p in holders)}" if holders else ""
    raise SystemExit(f"port {port} is in use{who}: stop that process or give this one another port")


def taken_port_warning(port: int, ranges: dict[str, range]) -> str | None:
    """A warning for a port that Ray may take first (`processes.taken_port_ranges`): while the cluster
    starts, before HAProxy binds its own ports."""
    for what, taken in ranges.items():
        if port in taken:
            return (
                f"warning: port {port} is in {what} ({taken.start}-{taken.stop - 1}): one of them may take it before HAProxy binds it, "
                "and the start then fails; choose a port outside it (the defaults 8000, 8404 and 9101 are)"
            )
    return None


def start_driver(argv: list[str], folder: str) -> subprocess.Popen:
    """The Ray driver in a session of its own (a terminal's Ctrl-C reaches only the launcher), marked,
    with the launch's files in its private ``folder`` (`deployments.private_folder`)."""
    env = private_environment(folder, dict(os.environ)) | FAST_PATH_ENV | idle_env(os.environ) | {LAUNCH_ENV: str(os.getpid())}
    return subprocess.Popen([sys.executable, "-m", DRIVER_MODULE, *argv], env=env, start_new_session=True)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def watch(driver: subprocess.Popen, stops: StopSignals) -> str:
    """Wait until a stop signal, the driver's exit, or the end of Ray's GCS or raylet; say which."""
    vital: list[psutil.Process] = []
    while True:
        if stops.first:
            return f"{stops.first} received"
        if (code := driver.poll()) is not None:
            return f"the Ray driver exited with status {code}"
        if len(vital) < len(VITAL_RAY_PROCESSES):  # until both have started
            vital = [p for p in marked_processes(os.getpid()) if process_name(p) in VITAL_RAY_PROCESSES and _alive(p)]
        elif not all(_alive(p) for p in vital):
            return "Ray's GCS or raylet ended (`ray stop`, a crash, or the driver's failure above)"
        time.sleep(WATCH_INTERVAL_S)


def stop_driver(driver: subprocess.Popen, stops: StopSignals, drain_timeout_s: float = 0.0) -> None:
    """SIGTERM the driver (it drains the replicas' own servers for up to ``drain_timeout_s``, then shuts
    Ray down) and wait up to that and `DRIVER_GRACE_S`, or until a second signal."""
    if driver.poll() is not None:
        return
    signals_before = stops.count
    driver.terminate()
    deadline = time.monotonic() + drain_timeout_s + DRIVER_GRACE_S
    while driver.poll() is None and time.monotonic() < deadline and stops.count == signals_before:
        time.sleep(0.1)


def drain(socket_paths: list[str], stops: StopSignals, timeout_s: float) -> None:
    """Each HAProxy (one per node, by its admin socket) takes no new connection; wait until they
    forward no request, ``timeout_s`` passes, or another signal comes. An HAProxy that does not
    answer (it never started, or it is gone) ends the wait."""
    signals_before = stops.count
    deadline = time.monotonic() + timeout_s
    try:
        if not socket_paths:
            raise FileNotFoundError("no admin socket in the launch's folder")
        for path in socket_paths:
            haproxy_admin.stop_accepting(path)
        count = sum(haproxy_admin.in_flight(path) for path in socket_paths)
        if count:
            say(f"Draining: {count} requests in flight, for up to {timeout_s:g} s (a second signal stops at once)")
        while count and time.monotonic() < deadline and stops.count == signals_before:
            time.sleep(DRAIN_POLL_S)
            count = sum(haproxy_admin.in_flight(path) for path in socket_paths)
    except OSError as error:
        say(f"Not drained: HAProxy's admin socket does not answer ({error})")
        return
    say("Drained: no request in flight" if not count else f"Drain ended with {count} requests in flight")


def haproxy_sockets(folder: str) -> list[str]:
    """The admin sockets of the launch's HAProxy: Ray puts each node's in a folder named after the
    node, beside the path it was given (``<folder>/<node id>/admin.sock``)."""
    given = haproxy_files(folder)["RAY_SERVE_HAPROXY_SOCKET_PATH"]
    return sorted(glob.glob(os.path.join(os.path.dirname(given), "*", os.path.basename(given))))


def shut_down(
    driver: subprocess.Popen, stops: StopSignals, reason: str, folder: str | None = None, drain_timeout_s: float = 0.0, replica_front: bool = False
) -> None:
    """Drain (on a stop signal: through HAProxy, by its admin sockets in the launch's ``folder``, or, with
    the ``replica_front``, in the driver), stop the driver, then end every process that still carries
    this launcher's mark."""
    say(f"Stopping Spout: {reason}")
    draining = stops.count == 1 and drain_timeout_s > 0 and driver.poll() is None
    if draining and replica_front:
        say(f"Draining: the ingress replicas take no new connection and let their streams end, for up to {drain_timeout_s:g} s")
    elif draining and folder is not None:
        drain(haproxy_sockets(folder), stops, drain_timeout_s)
    if stops.count < 2:
        stop_driver(driver, stops, drain_timeout_s if draining and replica_front else 0.0)
    left = end_processes(marked_processes(os.getpid()))
    if left:
        raise SystemExit(f"Spout could not end {', '.join(describe(p) for p in left)}: end them with `kill -9`")
    say("Spout stopped: no process of it is left")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    check_authenticated(args, dict(os.environ))
    clear_stale_launches()
    for port, host in listening_ports(args).items():
        check_port(host, port)
        if warning := taken_port_warning(port, taken_port_ranges(dict(os.environ), ephemeral_ports())):
            say(warning)
    stops = StopSignals()
    folder = tempfile.mkdtemp(prefix=PRIVATE_FOLDER_PREFIX)  # mode 0700
    try:
        driver = start_driver(argv, folder)
        reason = watch(driver, stops)
        shut_down(driver, stops, reason, folder, args.drain_timeout_s, replica_front(args))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if not stops.count:
        sys.exit(1)


if __name__ == "__main__":
    main()
