"""`bench.lib.serve_cluster` makes Serve's request-router serialization safe for the harness's
threads: configs built by several threads at once never unregister the router's module twice."""

from __future__ import annotations

import threading

from ray.serve.config import RequestRouterConfig

from bench.lib import serve_cluster


def test_configs_built_by_several_threads_at_once_all_build():
    assert getattr(RequestRouterConfig._serialize_request_router_cls, "one_at_a_time", False)
    serve_cluster.serialize_request_routers_one_at_a_time()  # a second call wraps nothing twice
    assert RequestRouterConfig._serialize_request_router_cls.__wrapped__.__name__ == "_serialize_request_router_cls"
    errors: list[Exception] = []

    def build() -> None:
        for _ in range(300):
            try:
                RequestRouterConfig()
            except ValueError as error:  # "... is not registered for pickle by value", unlocked
                errors.append(error)

    threads = [threading.Thread(target=build) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
