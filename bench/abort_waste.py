"""Abort waste: tokens the engine generates for a request after the stream no longer needs them.

``python -m bench.abort_waste [--quick]`` starts Ray and the app on loopback and, at 16 and
256 concurrent streams, measures per request, from the engine actor's own counters
(`EngineActor.num_generated`):

- stop string: tokens generated beyond the token that completed the stop string. Each
  request's stop string is cut from its greedy non-streaming twin's text; the tokens
  needed are the stream's ``usage.completion_tokens`` (the ingress keeps the tokens up
  to the one that completes the stop).
- disconnect: tokens generated after the client closed its stream, i.e. the count once
  the engine is idle less the count right after the close (after 8 tokens): the client
  closes the connection, then asks the engine for the request's count. The count call
  takes Ray's delivery time to land (a few ms), so the figure can be up to about one step
  under the tokens made since the socket closed; asking before the close instead counts
  the client's own lag in closing (one Python client reading 256 streams), which is not
  the server's waste.

At 16 streams each row pools 4 rounds (64 requests).

Every stream runs in the engine at once (``max_num_seqs`` = 256) without speculation, so
each running request gets one token per engine step: tokens of waste are engine steps; ``step_ms`` is
the mean step time during the streams. ``late_waits``: how often, during the row's rounds
(both causes), the engine stopped waiting for the ingress to route a step's outputs
(`deployments.step_credits`: the bound of 2 steps holds only while it waits). ``--quick`` runs tiny-random only; the full run adds
the default model. Rows go to bench/results/abort_waste.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import AsyncIterator
from contextlib import aclosing

import httpx

from bench.lib.common import print_table, quietness, write_results
from bench.lib.load_client import percentile
from bench.lib.serve_cluster import PROXY_OPTIONS, ServeCluster
from bench.serve_load import MAIN_PROXY, warm_up
from deployments import build_app
from deployments.engine_actor import EngineHandle
from deployments.engine_placement import app_engine
from engine.config import DEFAULT_MODEL

ROUNDS = {16: 4, 256: 1}  # concurrency -> rounds of streams, for enough requests per row
TWIN_TOKENS = 64  # the stop string is cut from the middle of this text
READ_BEFORE_CLOSE = 8  # tokens a disconnecting client reads first
DISCONNECT_MAX_TOKENS = 400  # far more than the engine makes before the abort lands
IDLE_TIMEOUT_S = 120
TIMEOUT_S = 900


def greedy_body(model: str, index: int, max_tokens: int, **fields: object) -> dict:
    """Request ``index``'s body: greedy and past EOS, so its text is known and long enough; no
    speculation, so a running request gets exactly one token per engine step."""
    prompt = f"Request {index}: tell me something."
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True, "num_speculative_tokens": 0}
    return body | fields


async def chunks(client: httpx.AsyncClient, body: dict) -> AsyncIterator[dict]:
    """The JSON chunks of a streamed completion."""
    async with client.stream("POST", "/v1/completions", json=body | {"stream": True}) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                yield json.loads(line[len("data: ") :])


async def engine_idle(engine: EngineHandle) -> None:
    """Wait until the engine runs and queues nothing: every abort has landed."""
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while time.monotonic() < deadline:
        stats = await engine.stats.remote()
        if stats["running"] == 0 and stats["waiting"] == 0:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError("the engine still has requests")


async def stop_strings(client: httpx.AsyncClient, model: str, count: int) -> list[str]:
    """Per request, a stop string first found in the middle of its greedy twin's text."""
    responses = await asyncio.gather(*(client.post("/v1/completions", json=greedy_body(model, i, TWIN_TOKENS)) for i in range(count)))
    return [stop_string(response.json()["choices"][0]["text"]) for response in responses]


def stop_string(text: str) -> str:
    """Three characters as near the middle of ``text`` as can be whose first occurrence is where they are cut
    (greedy text often repeats itself)."""
    middle = len(text) // 2
    for start in sorted(range(1, len(text) - 2), key=lambda s: abs(s - middle)):
        if text.find(text[start : start + 3]) == start:
            return text[start : start + 3]
    raise ValueError(f"no stop string in {text!r}")


async def stop_string_stream(client: httpx.AsyncClient, model: str, index: int, stop: str) -> tuple[str, int]:
    """The engine request id and the tokens the stream needed (up to the stop's completion)."""
    body = greedy_body(model, index, TWIN_TOKENS, stop=[stop], stream_options={"include_usage": True})
    request_id, needed, finish = "", -1, None
    async for chunk in chunks(client, body):
        request_id = f"{chunk['id']}-0"
        finish = next((c["finish_reason"] for c in chunk["choices"] if c["finish_reason"]), finish)
        if chunk.get("usage"):
            needed = chunk["usage"]["completion_tokens"]
    if finish != "stop":
        raise RuntimeError(f"request {index} did not stop on {stop!r}")
    return request_id, needed


async def disconnecting_stream(client: httpx.AsyncClient, engine: EngineHandle, model: str, index: int) -> tuple[str, int]:
    """Read ``READ_BEFORE_CLOSE`` tokens, close the connection, and ask the engine for the request's
    count as soon as the close returns (the client has left then); the id and that count."""
    received = 0
    async with aclosing(chunks(client, greedy_body(model, index, DISCONNECT_MAX_TOKENS, logprobs=0))) as stream:
        async for chunk in stream:
            received += sum(len(c["logprobs"]["tokens"]) for c in chunk["choices"] if c["logprobs"])
            if received >= READ_BEFORE_CLOSE:
                request_id = f"{chunk['id']}-0"
                break  # leaving the block closes the connection
        else:
            raise RuntimeError(f"request {index} ended before the client left")
    at_close = await engine.num_generated.remote([request_id])
    return request_id, at_close[request_id]


async def stop_string_round(client: httpx.AsyncClient, engine: EngineHandle, model: str, stops: list[str]) -> tuple[list[int], float]:
    """Waste per request of one round of concurrent stop-string streams, and the mean step time."""
    steps_before = (await engine.stats.remote())["steps"]
    started = time.perf_counter()
    stopped = await asyncio.gather(*(stop_string_stream(client, model, i, s) for i, s in enumerate(stops)))
    step_ms = (time.perf_counter() - started) * 1e3 / max(1, (await engine.stats.remote())["steps"] - steps_before)
    await engine_idle(engine)
    generated = await engine.num_generated.remote([rid for rid, _ in stopped])
    return [generated[rid] - needed for rid, needed in stopped], step_ms


async def disconnect_round(client: httpx.AsyncClient, engine: EngineHandle, model: str, concurrency: int) -> list[int]:
    """Waste per request of one round of concurrent streams whose clients leave."""
    closed = await asyncio.gather(*(disconnecting_stream(client, engine, model, i) for i in range(concurrency)))
    await engine_idle(engine)
    generated = await engine.num_generated.remote([rid for rid, _ in closed])
    return [generated[rid] - at_close for rid, at_close in closed]


async def measure(base_url: str, engine: EngineHandle, model: str, concurrency: int) -> list[dict]:
    late_before = (await engine.stats.remote())["late_subscribers"]
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    stop_waste: list[int] = []
    disconnect_waste: list[int] = []
    step_ms: list[float] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=TIMEOUT_S, limits=limits) as client:
        stops = await stop_strings(client, model, concurrency)
        for _ in range(ROUNDS[concurrency]):
            waste, ms = await stop_string_round(client, engine, model, stops)
            stop_waste += waste
            step_ms.append(ms)
            disconnect_waste += await disconnect_round(client, engine, model, concurrency)
    mean_step_ms = statistics.fmean(step_ms)
    late = (await engine.stats.remote())["late_subscribers"] - late_before
    return [row(model, concurrency, cause, waste, mean_step_ms, late) for cause, waste in (("stop_string", stop_waste), ("disconnect", disconnect_waste))]


def row(model: str, concurrency: int, cause: str, waste: list[int], step_ms: float, late_waits: int) -> dict:
    """Waste in tokens, which is also engine steps: each running request gets one token per step."""
    return {
        "model": model,
        "concurrency": concurrency,
        "cause": cause,
        "requests": len(waste),
        "waste_p50_steps": percentile(waste, 0.5),
        "waste_max_steps": max(waste),
        "waste_mean_steps": round(statistics.fmean(waste), 2),
        "step_ms": round(step_ms, 2),
        "late_waits": late_waits,
    }


def run_model(cluster: ServeCluster, model: str) -> list[dict]:
    port = cluster.deploy(build_app({"model": model, "max_num_seqs": 256, "max_model_len": 512}), "spout")
    try:
        warm_up(port, model)
        engine = app_engine("spout", 0)
        rows = []
        for concurrency in ROUNDS:
            rows += asyncio.run(measure(f"http://127.0.0.1:{port}", engine, model, concurrency))
            print_table(rows[-2:])
        return rows
    finally:
        cluster.delete("spout")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny-random only")
    parser.add_argument("--proxy", choices=PROXY_OPTIONS, default=MAIN_PROXY, help="Serve's HTTP option (see bench.lib.serve_cluster)")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    models = ["tiny-random"] if args.quick else ["tiny-random", DEFAULT_MODEL]
    rows: list[dict] = []
    with ServeCluster(args.proxy) as cluster:
        for model in models:
            rows += [{"proxy": args.proxy} | row for row in run_model(cluster, model)]
    print_table(rows)
    print(f"wrote {write_results('abort_waste', rows, quick=args.quick, **quietness(load_before))}")


if __name__ == "__main__":
    main()
