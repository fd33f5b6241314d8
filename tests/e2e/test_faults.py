"""Faults: a detokenizer replica dies under load; the engine actor dies mid-stream."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import ray

NUM_STREAMS = 32
RECOVERY_TIMEOUT_S = 180


def detok_replicas() -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if "Detokenizer" in a["name"]]


def test_detok_replica_dies_under_load_and_no_stream_is_lost(server):
    bodies = [
        {"model": server.model, "prompt": f"Tell me about the number {i}.", "max_tokens": 48, "temperature": 1.0, "seed": i, "extra_body": {"ignore_eos": True}}
        for i in range(NUM_STREAMS)
    ]

    async def stream(client, body: dict) -> str:
        text = ""
        async for chunk in await client.completions.create(stream=True, **body):
            text += "".join(choice.text for choice in chunk.choices)
        return text

    async def run() -> tuple[list[str], list[str]]:
        client = server.async_openai()
        tasks = [asyncio.create_task(stream(client, b)) for b in bodies]
        await asyncio.sleep(2.0)  # streams are flowing through the pool (batches above the inline threshold)
        (replica,) = detok_replicas()[:1]
        ray.kill(ray.get_actor(replica, namespace="serve"), no_restart=True)
        streamed = await asyncio.wait_for(asyncio.gather(*tasks), RECOVERY_TIMEOUT_S)
        twins = [r.choices[0].text for r in await asyncio.gather(*(client.completions.create(**b) for b in bodies))]
        await client.close()
        return streamed, twins

    streamed, twins = asyncio.run(run())
    assert streamed == twins


def test_engine_dies_mid_stream_then_recovers(server):
    body = {"model": server.model, "prompt": "Count to a thousand:", "max_tokens": 900, "temperature": 0.0, "ignore_eos": True, "stream": True}
    frames: list[str] = []
    with server.http() as http, http.stream("POST", "/v1/completions", json=body) as response:
        for line in response.iter_lines():
            if not line:
                continue
            frames.append(line)
            if len(frames) == 3:
                ray.kill(server.engine(), no_restart=False)
    assert frames[-1] == "data: [DONE]"
    error = json.loads(frames[-2][len("data: ") :])["error"]
    assert error["code"] == "engine_failed"
    started = time.monotonic()
    while time.monotonic() - started < RECOVERY_TIMEOUT_S:
        try:
            with server.http() as http:
                ok = http.post("/v1/completions", json={"model": server.model, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
            if ok.status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(1)
    assert ok.status_code == 200 and "Paris" in ok.json()["choices"][0]["text"]
