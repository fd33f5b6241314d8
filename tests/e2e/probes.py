"""What the reliability tests read from the running app: SSE payloads, Prometheus gauges,
the processes of its actors and their resident memory."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import ray
from prometheus_client.parser import text_string_to_metric_families

SERVE_NAMESPACE = "serve"
FULL_SIZE = os.environ.get("SPOUT_E2E_FULL") == "1"  # the reliability tests at the sizes the issue names, not CI's
GREEDY_PROMPT = "The capital of France is"


async def sse_payloads(response: httpx.Response) -> AsyncIterator[dict | None]:
    """Each ``data:`` frame of a streaming response, parsed; None for ``[DONE]``."""
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            yield None if data == "[DONE]" else json.loads(data)


def greedy_body(model: str, max_tokens: int = 8) -> dict:
    return {"model": model, "prompt": GREEDY_PROMPT, "max_tokens": max_tokens, "temperature": 0.0}


def greedy_text(http: httpx.Client, model: str) -> str:
    """The text of the probe request that shows the server still answers correctly."""
    response = http.post("/v1/completions", json=greedy_body(model))
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def gauges(http: httpx.Client) -> dict[str, float]:
    """The samples of ``GET /metrics`` by sample name, summed over their labels (engines, replicas, ...)."""
    response = http.get("/metrics")
    assert response.status_code == 200, response.text
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
    return samples


def serve_replicas(deployment: str) -> list[object]:
    """Handles of the live replica actors of a Serve deployment."""
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == SERVE_NAMESPACE]
    return [ray.get_actor(name, namespace=SERVE_NAMESPACE) for name in names if f"#{deployment}#" in name]


def actor_pid(actor: object) -> int:
    return ray.get(actor.__ray_call__.remote(lambda _: os.getpid()), timeout=60)  # type: ignore[attr-defined]


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (``VmRSS`` in /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"no VmRSS for pid {pid}")
