"""The processes one ``make run`` started, found by the mark in their environment, and their ports.

`deployments.launch` starts its Ray driver with ``SPOUT_LAUNCH=<the launcher's pid>`` in the
environment; every process under it inherits the variable whatever it becomes: Ray's GCS,
raylet and dashboard, the actors' workers (whose titles Ray rewrites), and the HAProxy a
worker spawns (which outlives its worker when that is killed). A process keeps its starting
environment when it is orphaned, so the mark finds what a launcher left behind after it died.
A process whose title overwrote its mark (Ray's agents) is found as a descendant of a marked one.
No Ray here: the launcher uses this before anything imports Ray.
"""

from __future__ import annotations

import errno
import os
import socket
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import psutil

LAUNCH_ENV = "SPOUT_LAUNCH"
"""The launcher's pid, in the environment of everything it started."""
LAUNCHER_MODULE = "deployments.launch"
TERM_GRACE_S = 5.0
KILL_WAIT_S = 5.0
EPHEMERAL_PORTS_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
"""Linux's range of ports handed to programs that bind port 0 (Ray's GCS, raylet and workers do)."""


@dataclass(frozen=True)
class Launch:
    """The processes marked with one launcher's pid, and whether that launcher still runs."""

    launcher_pid: int
    processes: list[psutil.Process]
    launcher_alive: bool

    def names(self) -> str:
        return ", ".join(sorted({process_name(p) for p in self.processes}))


def process_name(process: psutil.Process) -> str:
    """Its name, or ``?`` once it is gone."""
    try:
        return process.name()
    except psutil.Error:
        return "?"


def process_environ(process: psutil.Process) -> dict[str, str]:
    """``process``'s starting environment; empty when it is gone or not ours to read.

    Read from ``/proc/<pid>/environ`` whole, not through psutil: Ray's agents and dashboard modules
    set their titles with ``setproctitle``, which overwrites the start of that area, and psutil stops
    at the first empty entry (it read no variable of theirs, so a stop missed them)."""
    try:
        raw = Path(f"/proc/{process.pid}/environ").read_bytes()
    except OSError:  # gone, another user's, or a kernel thread
        return {}
    entries = (entry.decode(errors="replace").partition("=") for entry in raw.split(b"\0") if entry)
    return {name: value for name, sep, value in entries if sep}


def _mark(process: psutil.Process) -> int | None:
    value = process_environ(process).get(LAUNCH_ENV)
    return int(value) if value and value.isdigit() else None


def is_launcher(pid: int) -> bool:
    """Whether ``pid`` runs `deployments.launch` (not a later process that reuses the pid)."""
    try:
        return LAUNCHER_MODULE in psutil.Process(pid).cmdline()
    except psutil.Error:
        return False


def find_launches() -> list[Launch]:
    """Every launcher's processes on this machine (this user's, that is: others' are unreadable): those
    marked with its pid, and their descendants. A descendant may show no mark: Ray's agents set long
    process titles (``setproctitle``), which overwrite the start of the area /proc reads the
    environment from, the mark with it when it sits there; as children of the launch's raylet they
    are still found."""
    children: dict[int, list[psutil.Process]] = defaultdict(list)
    by_launcher: dict[int, dict[int, psutil.Process]] = defaultdict(dict)
    for process in psutil.process_iter(["ppid"]):
        if process.pid == os.getpid():
            continue
        children[process.info["ppid"]].append(process)
        if (mark := _mark(process)) is not None:
            by_launcher[mark][process.pid] = process
    for launch in by_launcher.values():
        unvisited = list(launch.values())
        while unvisited:
            for child in children[unvisited.pop().pid]:
                if child.pid not in launch:
                    launch[child.pid] = child
                    unvisited.append(child)
    return [Launch(pid, list(processes.values()), is_launcher(pid)) for pid, processes in sorted(by_launcher.items())]


def marked_processes(launcher_pid: int) -> list[psutil.Process]:
    """The processes one launcher started that still run."""
    return next((launch.processes for launch in find_launches() if launch.launcher_pid == launcher_pid), [])


def end_processes(processes: list[psutil.Process], grace_s: float = TERM_GRACE_S) -> list[psutil.Process]:
    """SIGTERM, then SIGKILL what is left after ``grace_s``; the processes still alive after that (none, normally)."""
    alive = processes
    for send, wait_s in ((psutil.Process.terminate, grace_s), (psutil.Process.kill, KILL_WAIT_S)):
        for process in alive:
            try:
                send(process)
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(alive, timeout=wait_s)
    return alive


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now (as HAProxy does, with SO_REUSEADDR)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def ephemeral_ports(path: Path = EPHEMERAL_PORTS_FILE) -> range:
    """The ports the kernel hands out for "any free port" (empty where it does not say)."""
    try:
        low, high = (int(word) for word in path.read_text().split())
    except (OSError, ValueError):
        return range(0)
    return range(low, high + 1)


DIRECT_INGRESS_PORTS = {"HTTP": (30000, 31000), "GRPC": (40000, 41000)}
"""Serve's defaults for the ports its replicas take for direct ingress (RAY_SERVE_DIRECT_INGRESS_MIN/MAX_<protocol>_PORT)."""


def taken_port_ranges(environ: dict[str, str], ephemeral: range) -> dict[str, range]:
    """Where Ray's processes take ports of their own while a launch starts (what each range is -> the range)."""
    ranges = {"the kernel's ephemeral range (net.ipv4.ip_local_port_range), from which Ray's GCS, raylet and workers take ports": ephemeral}
    for protocol, (low, high) in DIRECT_INGRESS_PORTS.items():
        low = int(environ.get(f"RAY_SERVE_DIRECT_INGRESS_MIN_{protocol}_PORT", low))
        high = int(environ.get(f"RAY_SERVE_DIRECT_INGRESS_MAX_{protocol}_PORT", high))
        ranges[f"Serve's direct-ingress {protocol} range, from which its replicas take ports"] = range(low, high + 1)
    return ranges


def port_holders(port: int) -> list[psutil.Process]:
    """The processes listening on ``port`` (on any address), where this user may see them."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return []
    pids = {c.pid for c in connections if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid}
    return [psutil.Process(pid) for pid in sorted(pids) if psutil.pid_exists(pid)]


def other_listeners(port: int, own_title: str) -> list[psutil.Process]:
    """The processes listening on ``port`` that are neither this one nor titled with ``own_title`` (a
    part of their command line: Ray titles a Serve replica ``ray::ServeReplica:<app>:<deployment>``)."""
    others = []
    for process in port_holders(port):
        try:
            if process.pid != os.getpid() and own_title not in " ".join(process.cmdline()):
                others.append(process)
        except psutil.Error:  # gone since, or not ours to read
            continue
    return others


def describe(process: psutil.Process) -> str:
    """``pid 123 (haproxy)``, and the launcher that started it where it has the mark."""
    mark = _mark(process)
    started = f", started by Spout's launcher pid {mark}" if mark is not None else ""
    return f"pid {process.pid} ({process_name(process)}{started})"
