"""Engines belong to one deployment of one configuration (issue 23): a redeploy of the same
application with another engine configuration serves with new engines and leaves none of the
old; deleting the application, or shutting Serve down, ends its engines. One local Ray cluster
as `make run` serves (HAProxy in front of the ingress), `tiny-random`."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import ray
from ray import serve

from bench.lib.serve_cluster import DEFAULT_PROXY, ServeCluster
from deployments import build_app
from deployments.driver import wait_until_healthy
from deployments.engine_placement import ENGINE_NAMESPACE, app_engines

APP = "spout"
OPTIONS = {"model": "tiny-random", "max_num_seqs": "8", "detok_min_replicas": "0"}
TIMEOUT_S = 300.0


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(0.5)


def deploy_and_serve(cluster: ServeCluster, max_model_len: int) -> None:
    """Deploy the app with ``max_model_len`` and wait until it runs and answers a completion."""
    port = cluster.deploy(build_app(OPTIONS | {"max_model_len": str(max_model_len)}), APP)
    wait_until_healthy(f"http://127.0.0.1:{port}", TIMEOUT_S)
    wait_for(lambda: serve.status().applications[APP].status == "RUNNING", "the app running")
    body = {"model": "tiny-random", "prompt": "hello", "max_tokens": 2}
    assert httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60).status_code == 200


def context_length(name: str) -> int:
    return ray.get(ray.get_actor(name, namespace=ENGINE_NAMESPACE).ready.remote(), timeout=60)


def test_a_redeploy_replaces_the_engines_and_a_delete_or_shutdown_ends_them():
    with ServeCluster(DEFAULT_PROXY) as cluster:
        deploy_and_serve(cluster, max_model_len=256)
        [first] = app_engines(APP)
        assert context_length(first) == 256
        deploy_and_serve(cluster, max_model_len=128)
        wait_for(lambda: first not in app_engines(APP), "the first configuration's engine ended", timeout_s=60)
        [second] = app_engines(APP)
        assert context_length(second) == 128
        serve.delete(APP)
        wait_for(lambda: app_engines(APP) == [], "no engine after the delete", timeout_s=60)
        deploy_and_serve(cluster, max_model_len=256)
        assert app_engines(APP) == [first]  # the same configuration, the same name
        serve.shutdown()
        wait_for(lambda: app_engines(APP) == [], "no engine after serve shutdown", timeout_s=60)
