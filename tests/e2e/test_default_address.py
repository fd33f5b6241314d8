"""The address Serve's entry points give (``serve run``, ``serve deploy``; ``make run ARGS="http_front=serve"``)
is the fast path: HAProxy on Serve's port in front of the ingress replica's own HTTP server. (Serve's proxy actor, a Ray call per frame, still runs: HAProxy keeps
it as a backup server for when no replica is up.)"""

from __future__ import annotations

import json

import ray

PROMPT = "The capital of France is"


def stream_text(server, base_url: str) -> str:
    body = {"model": server.model, "prompt": PROMPT, "max_tokens": 16, "temperature": 0.0, "stream": True}
    text = ""
    with server.http() as client, client.stream("POST", f"{base_url}/v1/completions", json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():  # line by line, as the openai SDK reads SSE
            if line.startswith("data: {"):
                text += json.loads(line[6:])["choices"][0]["text"]
    return text


def named_actor_classes() -> set[str]:
    """The classes of the cluster's named actors (Serve's controller and proxies are named)."""
    handles = [ray.get_actor(a["name"], namespace=a["namespace"]) for a in ray.util.list_named_actors(all_namespaces=True)]
    return {handle._ray_actor_creation_function_descriptor.class_name for handle in handles}


def test_haproxy_is_in_front(server):
    assert "HAProxyManager" in named_actor_classes()


def test_serve_port_is_not_the_replica_port(server):
    assert server.base_url != server.direct_url


def test_default_address_lists_the_model(server):
    for url in (server.base_url, server.direct_url):
        with server.http() as client:
            response = client.get(f"{url}/v1/models")
        assert response.status_code == 200
        assert [card["id"] for card in response.json()["data"]] == [server.model]


def test_default_address_streams_what_the_replica_streams(server):
    with server.http() as client:
        full = client.post("/v1/completions", json={"model": server.model, "prompt": PROMPT, "max_tokens": 16, "temperature": 0.0}).json()
    streamed = stream_text(server, server.base_url)
    assert streamed == full["choices"][0]["text"] != ""
    assert stream_text(server, server.direct_url) == streamed
