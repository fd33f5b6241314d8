"""`make run` stopped every way a user stops a server, then started again on the same ports: each
start serves (a completion is answered) on the shared port and the ingress replica's own, both on loopback alone,
and each stop leaves no process and no port behind (issue 23). HAProxy's front (``http_front=serve``), with its stats page
and exporter, is started and stopped by `test_launched_front.py`.

The ways: Ctrl-C (SIGINT to the launcher's process group), Ctrl-C twice, SIGTERM, SIGHUP, ``ray stop``
(which ends every Ray cluster of the machine: that way runs only where no other raylet runs), and
``make stop``. CI runs one cycle of `CI_WAYS`; ``SPOUT_E2E_FULL=1`` runs every way 10 times, the
issue's count, and ``SPOUT_LIFE_CYCLES=N`` every way N times.
"""

from __future__ import annotations

import os

import pytest

from tests.deployments.launched import CI_WAYS, START_TIMEOUT_S, STOP_TIMEOUT_S, STOP_WAYS, LaunchedServer, Ports, listen_addresses, ray_and_haproxy_processes

FULL_CYCLES = 10
CHOSEN_CYCLES = os.environ.get("SPOUT_LIFE_CYCLES") or (str(FULL_CYCLES) if os.environ.get("SPOUT_E2E_FULL") == "1" else None)
CYCLES = int(CHOSEN_CYCLES or 1)
WAYS = tuple(STOP_WAYS) if CHOSEN_CYCLES else CI_WAYS


@pytest.mark.timeout(CYCLES * (START_TIMEOUT_S + STOP_TIMEOUT_S) + 60)
@pytest.mark.parametrize("way", STOP_WAYS)
def test_each_stop_leaves_nothing_and_the_next_start_serves(way, tmp_path):
    if way not in WAYS:
        pytest.skip("runs with SPOUT_E2E_FULL=1 or SPOUT_LIFE_CYCLES=N")
    before = ray_and_haproxy_processes()
    ports = Ports()
    for cycle in range(CYCLES):
        server = LaunchedServer(tmp_path / f"launch-{cycle}.log", ports)
        try:
            server.start()
            server.wait_serving()
            assert (listen_addresses(ports.serve), listen_addresses(ports.own)) == ({"127.0.0.1"}, {"127.0.0.1"})  # shared port, the replica's own
            STOP_WAYS[way](server)
            status = server.wait_exit()
        finally:
            server.stop_if_running()
        assert server.left_behind(before) == [], f"cycle {cycle}:\n{server.log_tail()}"
        assert status == (1 if way == "ray-stop" else 0), server.log_tail()
