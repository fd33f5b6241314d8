"""The replica front's autoscaling policy: one ingress replica per target of the requests its replicas'
own servers report, the running count while none has reported."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from deployments.app import ingress_replicas
from deployments.config import ServeArgs
from deployments.ingress_autoscaling import REQUESTS_METRIC, requests_autoscaling_policy


def context(reports: dict[str, float], running: int = 1, target: float = 256) -> SimpleNamespace:
    metrics = {REQUESTS_METRIC: reports} if reports else {}
    return SimpleNamespace(aggregated_metrics=metrics, current_num_replicas=running, config=SimpleNamespace(target_ongoing_requests=target))


@pytest.mark.parametrize(
    ("reports", "wanted"),
    [({"a": 0.0}, 0), ({"a": 1.0}, 1), ({"a": 256.0}, 1), ({"a": 257.0}, 2), ({"a": 200.0, "b": 200.0}, 2), ({"a": 600.0, "b": 300.0}, 4)],
)
def test_one_replica_per_target_of_the_reported_requests(reports, wanted):
    assert requests_autoscaling_policy(context(reports, running=len(reports))) == (wanted, {})


def test_no_report_yet_keeps_the_running_count():
    assert requests_autoscaling_policy(context({}, running=3)) == (3, {})


def test_the_replica_front_autoscales_on_its_own_count_and_serves_on_serves_policy():
    options = {"ingress_min_replicas": "1", "ingress_max_replicas": "3", "ingress_target_streams": "8"}
    replica = ingress_replicas(ServeArgs.from_options(options | {"http_front": "replica"}, {}))["autoscaling_config"]
    assert replica["policy"] == {"policy_function": requests_autoscaling_policy} and replica["target_ongoing_requests"] == 8
    assert "policy" not in ingress_replicas(ServeArgs.from_options(options, {}))["autoscaling_config"]
    assert ingress_replicas(ServeArgs.from_options({"http_front": "replica"}, {})) == {"num_replicas": 1}
