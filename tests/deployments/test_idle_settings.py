"""`deployments.idle_settings`: Serve's idle settings for the commands that start Ray, the operator's own values kept."""

from __future__ import annotations

from deployments.idle_settings import IDLE_ENV, idle_env


def test_haproxy_threads_follow_the_cores_up_to_serves_four():
    assert idle_env({}, cores=2) == IDLE_ENV | {"RAY_SERVE_HAPROXY_NBTHREAD": "2"}
    assert idle_env({}, cores=64)["RAY_SERVE_HAPROXY_NBTHREAD"] == "4"


def test_the_operators_values_win():
    environ = {"RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.1", "RAY_SERVE_HAPROXY_NBTHREAD": "8"}
    assert idle_env(environ, cores=2) == {"RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000"}
