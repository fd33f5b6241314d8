"""The front door of a running ``make run ARGS="http_front=serve"`` (HAProxy in front of the ingress
replicas; one launch for the module, `tiny-random` on loopback, two ingress replicas): HAProxy's stats page and exporter
answer on loopback alone, each replica's own port answers ``/metrics`` with its own series, and Ray's GCS and dashboard refuse a
client without the launch's token while they take one with it (issue 23, "a locked front door").
The module ends the launch with Ctrl-C in the middle of streams and checks that they are drained
(each runs to its end) and that it leaves nothing behind: CI's Ctrl-C cycle of the life-cycle test
(`test_life_cycle.py` runs the other ways)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import httpx
import psutil
import pytest

from tests.deployments.launched import (
    OPTIONS,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    TWO_INGRESS_REPLICAS,
    LaunchedServer,
    ctrl_c_drains_streams_and_leaves_nothing,
    each_replicas_own_port_gives_its_own_series,
    listen_addresses,
    ray_and_haproxy_processes,
    serving,
)

DASHBOARD = re.compile(r"View the dashboard at \S*?http://([\d.]+):(\d+)")
CONNECT_TIMEOUT_S = 120.0
DRAIN_TIMEOUT_S = 80.0
"""Beyond the default 30 s: the drained streams (below) must end within it even on a loaded machine."""
RAY_CLIENT = "import ray; ray.init(address={address!r}, log_to_driver=False); print('connected', flush=True); ray.shutdown()"


@pytest.fixture(scope="module")
def processes_before() -> set[psutil.Process]:
    """Ray's and HAProxy's processes of others, running before the launch."""
    return ray_and_haproxy_processes()


@pytest.fixture(scope="module")
def server(tmp_path_factory, processes_before):
    with serving(
        tmp_path_factory.mktemp("front") / "launch.log", ["--drain-timeout-s", str(DRAIN_TIMEOUT_S), *OPTIONS, *TWO_INGRESS_REPLICAS, "http_front=serve"]
    ) as launched:
        yield launched


def driver_environ(server: LaunchedServer) -> dict[str, str]:
    driver = next(p for p in server.tree if "deployments.driver" in p.cmdline())
    return driver.environ()


def gcs_address(server: LaunchedServer) -> str:
    """The GCS address the launch's raylet was given (the GCS itself is started with port 0 and picks one)."""
    flags = [arg for process in server.tree if process.is_running() for arg in process.cmdline()]
    given = [arg.split("=", 1)[1] for arg in flags if arg.startswith("--gcs-address=")]
    if given:
        return given[0]
    gcs = next(process for process in server.tree if process.name() == "gcs_server")
    return f"127.0.0.1:{min(c.laddr.port for c in gcs.net_connections('tcp') if c.status == psutil.CONN_LISTEN)}"


def ray_client(address: str, env: dict[str, str], home: str) -> subprocess.CompletedProcess:
    """A Ray driver connecting to ``address`` with ``env`` (and a home of its own: no ~/.ray/auth_token);
    one still waiting after `CONNECT_TIMEOUT_S` is killed and counts as not connected (returncode None)."""
    base = {key: value for key, value in os.environ.items() if not key.startswith("RAY_AUTH")} | {"HOME": home}
    command = [sys.executable, "-c", RAY_CLIENT.format(address=address)]
    try:
        return subprocess.run(command, env=base | env, capture_output=True, text=True, timeout=CONNECT_TIMEOUT_S)
    except subprocess.TimeoutExpired as waited:
        output = [text.decode(errors="replace") if isinstance(text, bytes) else text or "" for text in (waited.stdout, waited.stderr)]
        return subprocess.CompletedProcess(command, None, *output)


@pytest.mark.timeout(START_TIMEOUT_S + STOP_TIMEOUT_S + 60)
def test_haproxys_stats_page_and_exporter_listen_on_loopback_alone(server):
    assert listen_addresses(server.ports.stats) == {"127.0.0.1"}
    assert listen_addresses(server.ports.metrics) == {"127.0.0.1"}
    assert httpx.get(f"http://127.0.0.1:{server.ports.metrics}/metrics", timeout=30).status_code == 200


@pytest.mark.timeout(3 * CONNECT_TIMEOUT_S + 60)
def test_each_replicas_own_port_gives_its_own_series(server):
    each_replicas_own_port_gives_its_own_series(server)


def test_ray_refuses_a_client_without_the_launchs_token(server, tmp_path):
    environ = driver_environ(server)
    assert environ["RAY_AUTH_MODE"] == "token" and "RAY_AUTH_TOKEN" not in environ
    token = open(environ["RAY_AUTH_TOKEN_PATH"]).read().strip()
    host, port = DASHBOARD.search(server.log.read_text(errors="replace")).groups()
    version = f"http://{host}:{port}/api/version"
    assert httpx.get(version, timeout=30).status_code in (401, 403)
    assert httpx.get(version, headers={"Authorization": "Bearer wrong"}, timeout=30).status_code in (401, 403)
    assert httpx.get(version, headers={"Authorization": f"Bearer {token}"}, timeout=30).status_code == 200
    address = gcs_address(server)
    without = ray_client(address, {"RAY_AUTH_MODE": "disabled"}, str(tmp_path))
    wrong = ray_client(address, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}, str(tmp_path))
    right = ray_client(address, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": environ["RAY_AUTH_TOKEN_PATH"]}, str(tmp_path))
    assert right.returncode == 0 and "connected" in right.stdout, right.stderr[-2000:]  # the address is right, the token lets one in
    for refused in (without, wrong):  # refused: an error (Ray's says the token is missing or invalid), or no connection at all
        assert refused.returncode != 0 and "connected" not in refused.stdout, refused.stderr[-2000:]
    assert psutil.Process(server.process.pid).is_running()


@pytest.mark.timeout(START_TIMEOUT_S + STOP_TIMEOUT_S + 60)
def test_ctrl_c_drains_the_streams_in_flight_and_leaves_nothing_behind(server, processes_before):
    """Last in the module: the launch's own end, by Ctrl-C while streams run: every stream runs to its
    end (the drain), then nothing of the launch is left."""
    ctrl_c_drains_streams_and_leaves_nothing(server, processes_before, "Draining: ")
