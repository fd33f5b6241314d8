"""`make run`'s launcher as a subprocess in a process group of its own, on loopback, with the
`tiny-random` model, and what is left of it once it has stopped.

What is left is judged without the launcher's own bookkeeping: the process tree seen while it
served (HAProxy included: a worker spawns it), Ray's and HAProxy's processes that were not there
before, and the ports it listened on.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.lib.serve_cluster import free_port

ROOT = Path(__file__).resolve().parents[2]
OPTIONS = ["model=tiny-random", "max_num_seqs=8", "max_model_len=256", "detok_min_replicas=0"]
TWO_INGRESS_REPLICAS = ["ingress_min_replicas=2", "ingress_max_replicas=2"]
SCRAPE_TIMEOUT_S = 30.0
START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 90.0
SERVES_LINE = re.compile(
    r"Spout serves on \S+ \((?:HAProxy on port \d+ in front of the ingress replicas' own ports \[([\d, ]*)\]"
    r"|each ingress replica listens there itself(?:; each also alone on one of \[([\d, ]*)\], its rank's)?)\)"
)
RAY_AND_HAPROXY = frozenset({"raylet", "gcs_server", "haproxy"})


def listening_ports() -> set[int]:
    """The TCP ports something listens on (a connection of a dead process in TIME-WAIT holds none)."""
    return {c.laddr.port for c in psutil.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}


def listen_addresses(port: int) -> set[str]:
    """The addresses something listens on at ``port`` (``0.0.0.0``/``::``: every interface)."""
    return {c.laddr.ip for c in psutil.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def ray_and_haproxy_processes() -> set[psutil.Process]:
    """Every raylet, GCS and HAProxy of this checkout's environment (those of other checkouts are other servers)."""
    found = set()
    for process in psutil.process_iter(["name", "exe"]):
        if process.info["name"] in RAY_AND_HAPROXY and (process.info["exe"] or "").startswith(sys.prefix):
            found.add(process)
    return found


def foreign_raylets(server: LaunchedServer) -> list[psutil.Process]:
    """The raylets on the machine that are not ``server``'s: other Ray clusters."""
    return [p for p in psutil.process_iter(["name"]) if p.info["name"] == "raylet" and p not in server.tree]


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _describe(process: psutil.Process) -> str:
    try:
        return f"pid {process.pid} ({process.name()}: {' '.join(process.cmdline())[:200]})"
    except psutil.Error:
        return f"pid {process.pid}"


@dataclass(frozen=True)
class Ports:
    """Where a launcher serves, the first of its ingress replicas' own ports (``http_front=replica``), and
    HAProxy's stats and exporter ports: the same for every start of a test."""

    serve: int = field(default_factory=free_port)
    own: int = field(default_factory=free_port)
    stats: int = field(default_factory=free_port)
    metrics: int = field(default_factory=free_port)


@dataclass
class LaunchedServer:
    """One ``python -m deployments.launch`` on ``ports``."""

    log: Path
    ports: Ports
    process: subprocess.Popen | None = None
    tree: list[psutil.Process] = field(default_factory=list)
    direct_ports: list[int] = field(default_factory=list)
    """The ingress replicas' own ports: Serve's direct ingress behind HAProxy, or those they listen on alone (``http_front=replica``)."""
    options: list[str] = field(default_factory=lambda: list(OPTIONS))

    def start(self) -> None:
        env = os.environ | {"RAY_SERVE_HAPROXY_STATS_PORT": str(self.ports.stats), "RAY_SERVE_HAPROXY_METRICS_PORT": str(self.ports.metrics)}
        command = [sys.executable, "-m", "deployments.launch", "--port", str(self.ports.serve), *self.options, f"http_own_port_min={self.ports.own}"]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_serving(self) -> None:
        """Until the launcher has printed its address and a completion is answered there; then the
        process tree as it stands (HAProxy and every Ray process included)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (match := SERVES_LINE.search(self.log.read_text(errors="replace"))):
            assert self.process.poll() is None, f"the launcher exited with {self.process.returncode}:\n{self.log_tail()}"
            assert time.monotonic() < deadline, f"not serving after {START_TIMEOUT_S:.0f} s:\n{self.log_tail()}"
            time.sleep(0.5)
        self.direct_ports = [int(port) for port in (match.group(1) or match.group(2) or "").split(",") if port.strip()]
        body = {"model": "tiny-random", "prompt": "hello", "max_tokens": 2}
        response = httpx.post(f"http://127.0.0.1:{self.ports.serve}/v1/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        self.tree = psutil.Process(self.process.pid).children(recursive=True)

    def signal_group(self, signum: int) -> None:
        """As a terminal's Ctrl-C does: to the launcher's whole process group."""
        os.killpg(self.process.pid, signum)

    def signal_launcher(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait_exit(self) -> int:
        try:
            return self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the launcher still runs {STOP_TIMEOUT_S:.0f} s after the stop:\n{self.log_tail()}") from None

    def stop_if_running(self) -> None:
        """After a failure: SIGTERM the launcher; SIGKILL its group where that does not do."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)

    def left_behind(self, before: set[psutil.Process]) -> list[str]:
        """What still runs of this server, or holds one of its ports (empty once it has stopped cleanly)."""
        processes = set(filter(_running, self.tree)) | set(filter(_running, ray_and_haproxy_processes() - before))
        ports = {self.ports.serve, self.ports.stats, self.ports.metrics, *self.direct_ports} & listening_ports()
        return [_describe(p) for p in processes] + [f"port {port} listened on" for port in sorted(ports)]

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@contextmanager
def serving(log: Path, options: list[str] = OPTIONS) -> Iterator[LaunchedServer]:
    """A launch with ``options`` on fresh ports, serving (a module's fixture); stopped at the end if it still runs."""
    launched = LaunchedServer(log, Ports(), options=list(options))
    try:
        launched.start()
        launched.wait_serving()
        yield launched
    finally:
        launched.stop_if_running()


def stop_twice(server: LaunchedServer) -> None:
    """Ctrl-C, and Ctrl-C again while it stops."""
    server.signal_group(signal.SIGINT)
    time.sleep(1)
    server.signal_group(signal.SIGINT)


def ray_stop(server: LaunchedServer) -> None:
    """``ray stop`` ends every Ray cluster of the machine: it runs only where the server's is the one."""
    if others := foreign_raylets(server):
        pytest.skip(f"`ray stop` would end other Ray clusters too (raylets {[p.pid for p in others]})")
    subprocess.run([str(Path(sys.executable).with_name("ray")), "stop"], capture_output=True, timeout=120, check=True)


def make_stop(server: LaunchedServer) -> None:
    subprocess.run([sys.executable, "-m", "deployments.stop"], cwd=ROOT, capture_output=True, timeout=STOP_TIMEOUT_S, check=True)


STOP_WAYS = {
    "ctrl-c": lambda server: server.signal_group(signal.SIGINT),
    "ctrl-c-twice": stop_twice,
    "sigterm": lambda server: server.signal_launcher(signal.SIGTERM),
    "sighup": lambda server: server.signal_launcher(signal.SIGHUP),
    "ray-stop": ray_stop,
    "make-stop": make_stop,
}
CI_WAYS = ("ctrl-c-twice", "ray-stop")
"""What CI runs, a cycle each: SIGTERM and SIGHUP take Ctrl-C's path in the launcher (`test_launch.py`
checks that they reach it), ``make stop`` sends SIGTERM, and Ctrl-C itself ends the launch of
`test_launched_front.py`, which checks it the same way."""


DRAINED_STREAMS = 16
"""Twice the launch's max_num_seqs: when the first stream has its first token, half of them have not
started, and cannot end before the first ones' `DRAINED_TOKENS` steps: they are in flight at the signal."""
DRAINED_TOKENS = 240


def stream_to_the_end(port: int, first_token: threading.Event, answered: threading.Semaphore) -> tuple[int, bool]:
    """One streamed completion: (its completion tokens from the usage frame, whether ``[DONE]`` came).
    ``answered`` is released once its response has begun (the request is in flight)."""
    body = {"model": "tiny-random", "prompt": "hello", "max_tokens": DRAINED_TOKENS, "ignore_eos": True, "stream": True}
    body["stream_options"] = {"include_usage": True}
    tokens, done = 0, False
    with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=STOP_TIMEOUT_S) as response:
        answered.release()
        for line in response.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                frame = json.loads(line[6:])
                tokens = (frame.get("usage") or {}).get("completion_tokens", tokens)
                if frame.get("choices"):
                    first_token.set()
    return tokens, done


def ctrl_c_drains_streams_and_leaves_nothing(server: LaunchedServer, processes_before: set[psutil.Process], drain_line: str) -> None:
    """Ctrl-C while `DRAINED_STREAMS` streams run: every stream runs to its end, the log says
    ``drain_line``, the launcher exits 0, and nothing of the launch is left."""
    first_token, answered = threading.Event(), threading.Semaphore(0)
    with ThreadPoolExecutor(DRAINED_STREAMS) as pool:
        streams = [pool.submit(stream_to_the_end, server.ports.serve, first_token, answered) for _ in range(DRAINED_STREAMS)]
        for _ in range(DRAINED_STREAMS):  # every request in flight (a connection after the signal is refused: the drain)
            assert answered.acquire(timeout=START_TIMEOUT_S), server.log_tail()
        assert first_token.wait(START_TIMEOUT_S), server.log_tail()
        STOP_WAYS["ctrl-c"](server)
        ends = [stream.result(timeout=STOP_TIMEOUT_S) for stream in streams]
    status = server.wait_exit()
    assert ends == [(DRAINED_TOKENS, True)] * DRAINED_STREAMS, server.log_tail()
    assert drain_line in server.log.read_text(errors="replace"), server.log_tail()
    assert server.left_behind(processes_before) == [], server.log_tail()
    assert status == 0, server.log_tail()


def scrape(port: int) -> dict[str, set[str]]:
    """A port's ``/metrics``: the ``replica`` labels of its replica series, the ``engine`` and ``model_name`` labels."""
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=SCRAPE_TIMEOUT_S)
    assert response.status_code == 200, response.text
    labels: dict[str, set[str]] = {"replica": set(), "engine": set(), "model_name": set()}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            for name, values in labels.items():
                if name in sample.labels:
                    values.add(sample.labels[name])
    return labels


def each_replicas_own_port_gives_its_own_series(server: LaunchedServer) -> None:
    """Metrics that survive the load balancer, on a launch with `TWO_INGRESS_REPLICAS` (docs/metrics.md,
    "Scraping several ingress replicas"): each replica's own port answers ``/metrics`` with its own
    ``replica`` label on its own series, the shared port with one of them, and the engines' series are
    the same whichever replica is asked."""
    assert len(server.direct_ports) == 2, server.log_tail()
    own = [scrape(port) for port in server.direct_ports]
    replicas = [labels["replica"] for labels in own]
    assert all(len(replica) == 1 for replica in replicas) and replicas[0] != replicas[1], replicas
    assert [labels["engine"] for labels in own] == [{"0"}, {"0"}]
    assert [labels["model_name"] for labels in own] == [{"tiny-random"}, {"tiny-random"}]
    assert scrape(server.ports.serve)["replica"] in replicas  # through the shared port: one replica's, labelled as such
