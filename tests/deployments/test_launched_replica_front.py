"""``make run`` as it starts by default, ``http_front=replica`` (one launch, `tiny-random` on loopback, two
ingress replicas): the ingress replicas listen on the launch's port themselves, and each alone on its own port (which
answers ``/metrics`` with its own series), with no HAProxy and no Serve proxy; Ctrl-C in the middle of
streams lets each run to its end (the driver drains the replicas), then nothing of the launch is
left, the port included."""

from __future__ import annotations

import psutil
import pytest

from tests.deployments.launched import (
    OPTIONS,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    TWO_INGRESS_REPLICAS,
    ctrl_c_drains_streams_and_leaves_nothing,
    each_replicas_own_port_gives_its_own_series,
    ray_and_haproxy_processes,
    serving,
)
from tests.deployments.test_launched_front import DRAIN_TIMEOUT_S


@pytest.fixture(scope="module")
def processes_before() -> set[psutil.Process]:
    return ray_and_haproxy_processes()


@pytest.fixture(scope="module")
def server(tmp_path_factory, processes_before):
    options = ["--drain-timeout-s", str(DRAIN_TIMEOUT_S), *OPTIONS, *TWO_INGRESS_REPLICAS]  # the default front
    with serving(tmp_path_factory.mktemp("replica-front") / "launch.log", options) as launched:
        yield launched


def listeners(port: int) -> set[int]:
    return {c.pid for c in psutil.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def test_the_replicas_listen_on_the_launchs_port_and_each_on_its_own_and_no_haproxy_runs(server):
    assert server.direct_ports == [server.ports.own, server.ports.own + 1]
    shared, own = listeners(server.ports.serve), [listeners(port) for port in server.direct_ports]
    assert len(shared) == 2 and own[0] | own[1] == shared and all(len(pids) == 1 for pids in own), (shared, own)
    assert all("Ingress" in " ".join(psutil.Process(pid).cmdline()) for pid in shared)
    assert not [p for p in server.tree if p.is_running() and p.name() == "haproxy"]
    assert "each ingress replica listens there itself" in server.log.read_text(errors="replace")


def test_each_replicas_own_port_gives_its_own_series(server):
    each_replicas_own_port_gives_its_own_series(server)


@pytest.mark.timeout(START_TIMEOUT_S + STOP_TIMEOUT_S + 60)
def test_ctrl_c_drains_the_streams_in_flight_and_leaves_nothing_behind(server, processes_before):
    ctrl_c_drains_streams_and_leaves_nothing(server, processes_before, "Draining: the ingress replicas")
