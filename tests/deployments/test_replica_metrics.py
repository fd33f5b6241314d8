"""Metrics that survive the load balancer, on a running ``make run`` with two ingress replicas
(`tiny-random` on loopback), with each front (the replicas' own server, ``make run``'s default, and
HAProxy's): each replica's own port answers ``/metrics`` with its own ``replica`` label on its own
series, the shared port answers with one of them, and the engines' series are the same whichever
replica is asked (docs/metrics.md, "Scraping several ingress replicas")."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.deployments.launched import OPTIONS, START_TIMEOUT_S, STOP_TIMEOUT_S, serving

SCRAPE_TIMEOUT_S = 30.0


@pytest.fixture(scope="module", params=["replica", "serve"])
def server(request, tmp_path_factory):
    options = [*OPTIONS, "ingress_min_replicas=2", "ingress_max_replicas=2", f"http_front={request.param}"]
    with serving(tmp_path_factory.mktemp("replicas") / "launch.log", options) as launched:
        yield launched


def scrape(port: int) -> dict[str, set[str]]:
    """A port's ``/metrics``: the ``replica`` labels of its replica series, the ``engine`` labels of its engine series."""
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=SCRAPE_TIMEOUT_S)
    assert response.status_code == 200, response.text
    labels: dict[str, set[str]] = {"replica": set(), "engine": set(), "model_name": set()}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            for name, values in labels.items():
                if name in sample.labels:
                    values.add(sample.labels[name])
    return labels


@pytest.mark.timeout(START_TIMEOUT_S + STOP_TIMEOUT_S + 60)
def test_each_replicas_own_port_gives_its_own_series(server):
    assert len(server.direct_ports) == 2, server.log_tail()
    own = [scrape(port) for port in server.direct_ports]
    replicas = [labels["replica"] for labels in own]
    assert all(len(replica) == 1 for replica in replicas) and replicas[0] != replicas[1], replicas
    assert [labels["engine"] for labels in own] == [{"0"}, {"0"}]
    assert [labels["model_name"] for labels in own] == [{"tiny-random"}, {"tiny-random"}]
    assert scrape(server.ports.serve)["replica"] in replicas  # through the shared port: one replica's, labelled as such
