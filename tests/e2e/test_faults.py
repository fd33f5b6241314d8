"""Faults: a detokenizer replica dies under 256 streams; the engine actor dies mid-stream; the
engine actors belong to the application, not to an ingress replica.

CI runs 256 streams of 8 tokens; ``SPOUT_E2E_FULL=1`` runs them with 48 tokens each.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import ray

from deployments.engine_placement import app_engines
from tests.e2e.probes import FULL_SIZE, greedy_body, greedy_text, serve_replicas, sse_payloads

NUM_STREAMS = 256
NUM_DISTINCT = 32  # each body is streamed 8 times; its one non-streaming twin checks all 8
STREAM_TOKENS = 48 if FULL_SIZE else 8
LOAD_TIMEOUT_S = 600
IN_FLIGHT_AT_ENGINE_DEATH = 4
RECOVERY_BOUND_S = 60.0  # engine killed -> first successful new request (the model reloads on CPU)


def stream_body(model: str, index: int) -> dict:
    """Half greedy, half seeded: both must equal their non-streaming twin whatever the batch."""
    sampling = {"temperature": 0.0} if index % 2 == 0 else {"temperature": 1.0, "seed": index}
    return {"model": model, "prompt": f"Tell me about the number {index}.", "max_tokens": STREAM_TOKENS, "ignore_eos": True, **sampling}


async def stream_text(client: httpx.AsyncClient, body: dict, progress: list[int]) -> str | None:
    """The streamed text, or None if the stream failed (a non-200 status or an error frame)."""
    text = ""
    async with client.stream("POST", "/v1/completions", json=body | {"stream": True}) as response:
        if response.status_code != 200:
            return None
        async for payload in sse_payloads(response):
            if payload is None:
                return text
            if "error" in payload:
                return None
            text += "".join(choice["text"] for choice in payload["choices"])
            progress.append(1)
    return None


def http_client(server, connections: int, timeout_s: float) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    headers = {"Authorization": f"Bearer {server.api_key}"}
    return httpx.AsyncClient(base_url=server.base_url, headers=headers, timeout=timeout_s, limits=limits)


def test_detok_replica_dies_under_load_and_no_stream_is_lost(server):
    bodies = [stream_body(server.model, i) for i in range(NUM_DISTINCT)]

    async def run() -> tuple[list[str | None], list[str | None]]:
        progress: list[int] = []
        async with http_client(server, NUM_STREAMS, LOAD_TIMEOUT_S) as client:
            tasks = [asyncio.create_task(stream_text(client, bodies[i % NUM_DISTINCT], progress)) for i in range(NUM_STREAMS)]
            while len(progress) < 64 and not all(t.done() for t in tasks):
                await asyncio.sleep(0.05)  # the engine's batches of 32 go through the pool (threshold 8)
            assert sum(not t.done() for t in tasks) > NUM_STREAMS // 2, "the load ended before the kill"
            (replica, *_) = serve_replicas("Detokenizer")
            ray.kill(replica, no_restart=True)
            streamed = await asyncio.wait_for(asyncio.gather(*tasks), LOAD_TIMEOUT_S)
            print(f"\n{NUM_STREAMS} streams of {STREAM_TOKENS} tokens, a detok replica killed: {time.monotonic() - started:.1f} s")
            responses = await asyncio.gather(*(client.post("/v1/completions", json=body) for body in bodies))
        twins = [r.json()["choices"][0]["text"] if r.status_code == 200 else None for r in responses]
        return streamed, twins

    started = time.monotonic()
    streamed, twins = asyncio.run(run())
    assert [i for i, text in enumerate(streamed) if text is None] == []  # no stream failed
    assert None not in twins
    assert [i for i, text in enumerate(streamed) if text != twins[i % NUM_DISTINCT]] == []  # no text is wrong


async def read_until_killed(client: httpx.AsyncClient, body: dict, started: asyncio.Event, all_started) -> list[dict | None]:
    """Every payload of a long stream; signals once it has produced text."""
    payloads: list[dict | None] = []
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for payload in sse_payloads(response):
            payloads.append(payload)
            if len(payloads) == 2:
                started.set()
                await all_started
    return payloads


def test_engine_dies_mid_stream_then_recovers(server):
    with server.http() as http:
        expected = greedy_text(http, server.model)
    long_body = {"model": server.model, "prompt": "Count to a thousand:", "max_tokens": 900, "temperature": 0.0, "ignore_eos": True, "stream": True}

    async def kill_during_streams() -> tuple[list[list[dict | None]], float]:
        async with http_client(server, IN_FLIGHT_AT_ENGINE_DEATH, LOAD_TIMEOUT_S) as client:
            events = [asyncio.Event() for _ in range(IN_FLIGHT_AT_ENGINE_DEATH)]
            all_started = asyncio.gather(*(e.wait() for e in events))
            streams = [asyncio.create_task(read_until_killed(client, long_body, e, all_started)) for e in events]
            await asyncio.wait_for(all_started, LOAD_TIMEOUT_S)
            ray.kill(server.engine(), no_restart=False)
            killed = time.monotonic()
            return await asyncio.wait_for(asyncio.gather(*streams), LOAD_TIMEOUT_S), killed

    payloads, killed = asyncio.run(kill_during_streams())
    for stream in payloads:
        assert stream[-1] is None  # data: [DONE]
        assert stream[-2]["error"]["code"] == "engine_failed", stream[-2]
        assert len(stream) < 900
    statuses = []
    with server.http() as http:
        while time.monotonic() - killed < RECOVERY_BOUND_S:
            response = http.post("/v1/completions", json=greedy_body(server.model))
            statuses.append(response.status_code)
            if response.status_code == 200:
                break
            time.sleep(0.2)
        recovery_s = time.monotonic() - killed
        print(f"\nengine killed -> first successful request: {recovery_s:.1f} s (statuses on the way: {statuses})")
        assert statuses[-1] == 200 and recovery_s < RECOVERY_BOUND_S
        assert set(statuses) <= {200, 503}, statuses
        assert response.json()["choices"][0]["text"] == expected
        assert greedy_text(http, server.model) == expected


def test_the_engine_belongs_to_the_application_not_to_an_ingress_replica(server):
    """Detached, so it outlives every ingress replica (one owned by a replica would die with it)."""
    [name] = app_engines("spout")
    [engine] = [a for a in ray._private.state.actors().values() if a["Name"] == name and a["State"] == "ALIVE"]
    assert engine["IsDetached"]
