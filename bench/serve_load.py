"""Egress load: N concurrent streaming clients against the real Serve app on loopback.

``python -m bench.serve_load [--quick]`` starts Ray and the app itself (tiny-random, so the
engine's step is cheap and the egress path is what is measured), and for each detok mode
(inline only, pool of 1, pool of 2) and concurrency reports TTFT and inter-token latency
p50/p99, output tokens/s, failed and wrong streams (each stream's text against its
non-streaming twin), and CPU µs per output token of each process, read from
/proc. Rows go to bench/results/serve_load.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import ray
from ray import serve

from bench.common import print_table, write_results
from deployments import build_app

MODEL = "tiny-random"
MODES = {
    "inline": {"inline_detok_threshold": 1_000_000, "detok_min_replicas": 1, "detok_max_replicas": 1},
    "pool_1": {"inline_detok_threshold": 0, "detok_min_replicas": 1, "detok_max_replicas": 1},
    "pool_2": {"inline_detok_threshold": 0, "detok_min_replicas": 2, "detok_max_replicas": 2},
}
PROCESS_TITLES = {"ingress": "Ingress", "detok": "Detokenizer", "engine": "EngineActor", "proxy": "ProxyActor"}
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass
class StreamResult:
    text: str = ""
    tokens: int = 0
    ttft_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)
    failed: bool = False


def process_cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system) so far of each kind of Ray process, summed over its processes."""
    totals = dict.fromkeys(PROCESS_TITLES, 0.0)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        for kind, marker in PROCESS_TITLES.items():
            if title.startswith("ray::") and marker in title:
                totals[kind] += (int(fields[11]) + int(fields[12])) / TICKS_PER_S
    return totals


def body(index: int, max_tokens: int, stream: bool) -> dict:
    """Greedy, so the engine's step stays cheap and the egress path is what is measured;
    tiny-random's greedy continuations differ per prompt."""
    return {
        "model": MODEL,
        "prompt": f"Request {index}: tell me something.",
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": stream,
    }


async def stream_one(client: httpx.AsyncClient, index: int, max_tokens: int) -> StreamResult:
    result = StreamResult()
    started = last = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/completions", json=body(index, max_tokens, True)) as response:
            if response.status_code != 200:
                result.failed = True
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    result.failed = True
                    return result
                now = time.perf_counter()
                for choice in chunk["choices"]:
                    if not choice["text"]:
                        continue
                    if result.ttft_s is None:
                        result.ttft_s = now - started
                    else:
                        result.gaps_s.append(now - last)
                    last = now
                    result.text += choice["text"]
                    result.tokens += 1 if choice["logprobs"] is None else len(choice["logprobs"]["tokens"])
    except httpx.HTTPError:
        result.failed = True
    return result


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _client(base_url: str, concurrency: int, timeout_s: float) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    return httpx.AsyncClient(base_url=base_url, timeout=timeout_s, limits=limits)


async def run_streams(base_url: str, concurrency: int, max_tokens: int, timeout_s: float) -> tuple[list[StreamResult], float]:
    """All streams at once; their results and the wall time they took."""
    async with _client(base_url, concurrency, timeout_s) as client:
        started = time.perf_counter()
        results = await asyncio.wait_for(
            asyncio.gather(*(stream_one(client, i, max_tokens) for i in range(concurrency))), timeout_s
        )
        return results, time.perf_counter() - started


async def twin_texts(base_url: str, count: int, max_tokens: int, timeout_s: float) -> list[str | None]:
    """The non-streaming texts the streams must equal, 64 requests at a time."""
    twins: list[str | None] = []
    async with _client(base_url, 64, timeout_s) as client:
        for start in range(0, count, 64):
            responses = await asyncio.gather(
                *(client.post("/v1/completions", json=body(i, max_tokens, False)) for i in range(start, min(count, start + 64)))
            )
            twins += [r.json()["choices"][0]["text"] if r.status_code == 200 else None for r in responses]
    return twins


def measure_mode(base_url: str, mode: str, levels: list[int], max_tokens: int, timeout_s: float) -> list[dict]:
    rows = []
    for concurrency in levels:
        cpu_before = process_cpu_seconds()
        results, elapsed = asyncio.run(run_streams(base_url, concurrency, max_tokens, timeout_s))
        cpu_after = process_cpu_seconds()  # the streams alone; the twins below are not counted
        twins = asyncio.run(twin_texts(base_url, concurrency, max_tokens, timeout_s))
        output_tokens = sum(r.tokens for r in results)
        cpu_us = {k: (cpu_after[k] - cpu_before[k]) / max(output_tokens, 1) * 1e6 for k in cpu_before}
        ttfts = [r.ttft_s for r in results if r.ttft_s is not None]
        gaps = [g for r in results for g in r.gaps_s]
        row = {
            "model": MODEL,
            "mode": mode,
            "concurrency": concurrency,
            "ttft_p50_ms": round(percentile(ttfts, 0.5) * 1e3, 1),
            "ttft_p99_ms": round(percentile(ttfts, 0.99) * 1e3, 1),
            "itl_p50_ms": round(percentile(gaps, 0.5) * 1e3, 2),
            "itl_p99_ms": round(percentile(gaps, 0.99) * 1e3, 2),
            "output_tokens_per_s": round(output_tokens / elapsed, 1),
            "failed_streams": sum(r.failed for r in results),
            "wrong_streams": sum(not r.failed and r.text != twin for r, twin in zip(results, twins)),
            "cpu_us_per_token": round(sum(cpu_us.values()), 1),
        }
        row |= {f"cpu_us_{kind}": round(value, 1) for kind, value in cpu_us.items()}
        rows.append(row)
        print_table([row])
    return rows


def wait_healthy(base_url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base_url}/health", timeout=30).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the Serve app did not become healthy")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="concurrency 1, 16, 64, 256 and short outputs")
    args = parser.parse_args(argv)
    levels = [1, 16, 64, 256] if args.quick else [1, 16, 64, 256, 512, 1024]
    max_tokens = 32 if args.quick else 64
    port = free_port()
    ray.init(num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    rows: list[dict] = []
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config={"enable_access_log": False})
        for mode, options in MODES.items():
            app = build_app({"model": MODEL, "max_num_seqs": 256, "max_model_len": 256, **options})
            serve.run(app, name="spout", route_prefix="/", blocking=False)
            base_url = f"http://127.0.0.1:{port}"
            wait_healthy(base_url, timeout_s=300)
            asyncio.run(run_streams(base_url, 4, 4, 120))  # warm-up: engine loaded, paths compiled
            rows += measure_mode(base_url, mode, levels, max_tokens, timeout_s=600)
            serve.delete("spout")
            # The engine actor is owned by the ingress replica and goes with it.
            time.sleep(2)
    finally:
        serve.shutdown()
        ray.shutdown()
    print_table(rows)
    summary = {"max_tokens": max_tokens, "median_cpu_us_per_token": statistics.median(r["cpu_us_per_token"] for r in rows)}
    print(f"wrote {write_results('serve_load', rows, quick=args.quick, **summary)}")


if __name__ == "__main__":
    main()
