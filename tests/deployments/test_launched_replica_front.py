"""``make run`` as it starts by default, ``http_front=replica`` (one launch, `tiny-random` on loopback): the
ingress replica listens on the launch's port itself, and alone on its own port, with no HAProxy and no Serve proxy; Ctrl-C in the middle of
streams lets each run to its end (the driver drains the replicas), then nothing of the launch is
left, the port included."""

from __future__ import annotations

import psutil
import pytest

from tests.deployments.launched import OPTIONS, START_TIMEOUT_S, STOP_TIMEOUT_S, ctrl_c_drains_streams_and_leaves_nothing, ray_and_haproxy_processes, serving
from tests.deployments.test_launched_front import DRAIN_TIMEOUT_S


@pytest.fixture(scope="module")
def processes_before() -> set[psutil.Process]:
    return ray_and_haproxy_processes()


@pytest.fixture(scope="module")
def server(tmp_path_factory, processes_before):
    options = ["--drain-timeout-s", str(DRAIN_TIMEOUT_S), *OPTIONS]  # the default front
    with serving(tmp_path_factory.mktemp("replica-front") / "launch.log", options) as launched:
        yield launched


def listeners(port: int) -> set[int]:
    return {c.pid for c in psutil.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def test_the_replica_listens_on_the_launchs_port_and_its_own_and_no_haproxy_runs(server):
    shared, own = listeners(server.ports.serve), listeners(server.ports.own)
    assert shared and shared == own and all("Ingress" in " ".join(psutil.Process(pid).cmdline()) for pid in shared), (shared, own)
    assert server.direct_ports == [server.ports.own]
    assert not [p for p in server.tree if p.is_running() and p.name() == "haproxy"]
    assert "each ingress replica listens there itself" in server.log.read_text(errors="replace")


@pytest.mark.timeout(START_TIMEOUT_S + STOP_TIMEOUT_S + 60)
def test_ctrl_c_drains_the_streams_in_flight_and_leaves_nothing_behind(server, processes_before):
    ctrl_c_drains_streams_and_leaves_nothing(server, processes_before, "Draining: the ingress replicas")
