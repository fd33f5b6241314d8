"""Egress load: N concurrent streaming clients against the real Serve app on loopback.

``python -m bench.serve_load [--quick]`` starts Ray and the apps itself and, for each
model, Serve proxy option (`bench.lib.serve_cluster`) and mode, starts N streams at once
(greedy, ``ignore_eos``) and reports TTFT and inter-token latency p50/p99 (the wait
between frames that carry text, as a client sees it), output tokens/s, tokens per
frame, failed and wrong streams (each stream's text against its non-streaming twin),
and CPU µs per output token of each process kind, read from /proc:
``cpu_us_per_token`` is the egress path (ingress, detok replicas and proxy together);
the engine, Serve's controller, Ray's own daemons and the load generator ("client")
are reported apart. Each run also records the processes' idle CPU (% of a core), and each
row's CPU is net of it (what each process would have used idle over the row's wall time is
subtracted), with the 1-minute load average before the row (the machine may be shared).

Each run has a client (`bench.lib.load_client.CLIENTS`: the project's own ``raw`` client or
``httpx``, an ordinary client reading each SSE line as the openai SDK does) and an address:
``serve_port`` (Serve's port: its proxy, or HAProxy in front of the replicas) or
``replica_port`` (the ingress replica's own, under direct ingress).

Modes: ``inline`` (detok in the ingress, no pool replica), ``pool_1`` / ``pool_2``
(every step on a pool of 1 / 2 replicas), ``pool_auto`` (the defaults before issue 24: inline below
256 tokens a step, else an autoscaling pool of 1 to 2 replicas, whose count is
recorded over time from ``serve.status()``), ``inline_si4`` (inline with
``stream_interval=4``), ``defaults`` (``make run``'s options), and the per-request-streaming references ``baseline`` (one
handle call per request, one chunk per token) and ``baseline_50ms`` (Ray Serve LLM's
default 50 ms chunk batching); see `bench.lib.stream_baseline`. Results go to
bench/results/serve_load.json and the plot to bench/results/serve_load.png.

``--ordinary-client`` (about 2.5 min) runs only `ordinary_client_plan`: the address ``make run``
gives and the replica's own port, with the httpx client, at 64 and 256 streams of 64 tokens,
and Serve's proxy for reference; its rows replace their own earlier rows in serve_load.json
and the other rows stay.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from dataclasses import asdict, dataclass

from bench.lib.common import RESULTS_DIR, print_table, quietness, write_results
from bench.lib.load_client import completion_body, latency_fields, reference_texts, run_streams
from bench.lib.process_cpu import cpu_seconds, cpu_used, per_token_us
from bench.lib.serve_cluster import DEFAULT_PROXY, DIRECT_INGRESS, PROXY_OPTIONS, ReplicaWatcher, ServeCluster
from bench.lib.serve_plot import plot_rows
from bench.lib.serve_report import address_table, autoscaling_table, baseline_ratios, proxy_table
from bench.lib.stream_baseline import build_baseline
from deployments import build_app

HOST = "127.0.0.1"
TIMEOUT_S = 900
MAIN_PROXY = "throughput_optimized"
MAX_MODEL_LEN = 256
SPOUT_MODES: dict[str, dict[str, object]] = {
    "inline": {"inline_detok_threshold": 1_000_000, "detok_min_replicas": 0, "detok_max_replicas": 1},
    "pool_1": {"inline_detok_threshold": 0, "detok_min_replicas": 1, "detok_max_replicas": 1},
    "pool_2": {"inline_detok_threshold": 0, "detok_min_replicas": 2, "detok_max_replicas": 2},
    "pool_auto": {"inline_detok_threshold": 256, "detok_min_replicas": 1, "detok_max_replicas": 2},
    "inline_si4": {"inline_detok_threshold": 1_000_000, "detok_min_replicas": 0, "detok_max_replicas": 1, "stream_interval": 4},
    "defaults": {},
}
BASELINE_MODES = {"baseline": 0.0, "baseline_50ms": 50.0}
IDLE_S = 6.0
RESULTS = RESULTS_DIR / "serve_load.json"
ROW_KEY = ("model", "mode", "proxy", "address", "client", "concurrency")
DOWNSCALE_WAIT_S = 90
"""Longer than the pool's downscale delay (30 s) plus its metrics window (5 s) and a replica's stop."""


@dataclass(frozen=True)
class Run:
    """One app (``mode``) under one proxy option, swept over ``levels`` of concurrency."""

    model: str
    proxy: str
    mode: str
    levels: tuple[int, ...]
    max_tokens: int
    address: str = ""
    """``serve_port`` or ``replica_port``; by default the replica's where nothing is in front of it."""
    client: str = "raw"

    def __post_init__(self) -> None:
        if not self.address:
            object.__setattr__(self, "address", "replica_port" if self.proxy in DIRECT_INGRESS else "serve_port")


def full_plan() -> list[Run]:
    all_levels = (1, 16, 64, 256, 512, 1024)
    modes = ["inline", "pool_1", "pool_2", "pool_auto", "inline_si4", *BASELINE_MODES]
    runs = [Run("tiny-random", MAIN_PROXY, mode, all_levels, 64) for mode in modes]
    runs += [Run("tiny-random", proxy, mode, (16, 256), 64) for proxy in PROXY_OPTIONS if proxy != MAIN_PROXY for mode in ("inline", "baseline")]
    # The default model decodes about 10x slower on this CPU: fewer levels, modes and tokens.
    runs += [Run("smollm2-135m-instruct", MAIN_PROXY, mode, (1, 16, 64, 256), 32) for mode in ("inline", "baseline")]
    return runs + ordinary_client_plan()


def quick_plan() -> list[Run]:
    return [Run("tiny-random", MAIN_PROXY, "inline", (1, 64, 256), 32), Run("tiny-random", MAIN_PROXY, "baseline", (256,), 32)]


def ordinary_client_plan() -> list[Run]:
    """``make run``'s address (HAProxy on Serve's port) against the replica's own port, then
    Serve's proxy on Serve's port (port 8000 before), all with the httpx client and ``make run``'s options."""
    runs = [Run("tiny-random", DEFAULT_PROXY, "defaults", (64, 256), 64, address, "httpx") for address in ("serve_port", "replica_port")]
    return runs + [Run("tiny-random", MAIN_PROXY, "defaults", (64, 256), 64, "serve_port", "httpx")]


def build(run: Run):
    max_num_seqs = max(run.levels)
    if run.mode in BASELINE_MODES:
        return build_baseline(run.model, max_num_seqs, MAX_MODEL_LEN, BASELINE_MODES[run.mode])
    return build_app({"model": run.model, "max_num_seqs": max_num_seqs, "max_model_len": MAX_MODEL_LEN, **SPOUT_MODES[run.mode]})


def warm_up(port: int, model: str) -> None:
    """A few streams until one round succeeds: the engine is loaded and every path has run once."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        results, _ = asyncio.run(run_streams(HOST, port, [completion_body(model, i, 4, True) for i in range(4)], 120))
        if not any(r.failed for r in results):
            return
        time.sleep(1)
    raise RuntimeError("the app did not answer")


def idle_cpu_percent() -> dict[str, float]:
    """% of a core each process kind uses with no request in flight (Serve's health checks, metrics)."""
    before = cpu_seconds()
    time.sleep(IDLE_S)
    return {f"idle_pct_{kind}": round(seconds / IDLE_S * 100, 2) for kind, seconds in cpu_used(before, cpu_seconds()).items()}


def measure_level(port: int, run: Run, concurrency: int, references: list[str | None], idle: dict[str, float]) -> dict:
    bodies = [completion_body(run.model, i, run.max_tokens, stream=True) for i in range(concurrency)]
    load_average = os.getloadavg()[0]
    before = cpu_seconds()
    results, elapsed = asyncio.run(run_streams(HOST, port, bodies, TIMEOUT_S, run.client))
    idle_cores = {key.removeprefix("idle_pct_"): pct / 100 for key, pct in idle.items() if key.startswith("idle_pct_")}
    cpu = per_token_us(before, cpu_seconds(), sum(r.tokens for r in results), idle_cores, elapsed)
    row = {"model": run.model, "mode": run.mode, "proxy": run.proxy, "address": run.address, "client": run.client, "concurrency": concurrency}
    row |= latency_fields(results, references, elapsed) | {"load_average_before": round(load_average, 2)}
    row["cpu_us_per_token"] = cpu.pop("egress")
    return row | {f"cpu_us_{kind}": value for kind, value in cpu.items()}


def sweep(cluster: ServeCluster, run: Run, references: dict[str, list[str | None]], watcher: ReplicaWatcher | None = None) -> tuple[list[dict], dict]:
    """Deploy ``run``'s app, measure each level, delete it; the rows and the idle CPU. With a
    ``watcher``, label its phases and, after the last level, wait for the pool to scale down."""
    cluster.deploy(build(run), run.mode)
    port = cluster.port if run.address == "serve_port" else cluster.direct_port(run.mode)
    warm_up(port, run.model)
    if run.model not in references:  # once per model, from the first spout app, not timed
        bodies = [completion_body(run.model, i, run.max_tokens, stream=False) for i in range(max(run.levels))]
        references[run.model] = asyncio.run(reference_texts(HOST, port, bodies, 64, TIMEOUT_S))
    idle = {"model": run.model, "mode": run.mode, "proxy": run.proxy, "address": run.address, "client": run.client} | idle_cpu_percent()
    rows = []
    for concurrency in run.levels:
        if watcher is not None:
            watcher.phase = f"{concurrency} streams"
        rows.append(measure_level(port, run, concurrency, references[run.model], idle))
        print_table(rows[-1:])
    if watcher is not None:
        watcher.phase = "idle"
        watcher.scaled_down_s = watcher.wait_for(running=1, timeout_s=DOWNSCALE_WAIT_S)
        watcher.phase = "app deleted"
    cluster.delete(run.mode)
    return rows, idle


def run_plan(plan: list[Run]) -> tuple[list[dict], list[dict], dict]:
    """Every run, one Ray cluster per proxy option; rows, idle CPU per run, the autoscaling record."""
    rows: list[dict] = []
    idle: list[dict] = []
    autoscaling: dict = {}
    references: dict[str, list[str | None]] = {}
    for proxy in dict.fromkeys(run.proxy for run in plan):
        with ServeCluster(proxy) as cluster:
            for run in (r for r in plan if r.proxy == proxy):
                if run.mode != "pool_auto":
                    new_rows, new_idle = sweep(cluster, run, references)
                else:
                    with ReplicaWatcher(run.mode, "Detokenizer") as watcher:
                        new_rows, new_idle = sweep(cluster, run, references, watcher)
                    autoscaling = {"timeline": watcher.timeline, "scaled_down_after_load_s": watcher.scaled_down_s}
                rows += new_rows
                idle.append(new_idle)
    return rows, idle, autoscaling


def merge_ordinary_client(rows: list[dict], idle: list[dict], wall_s: float, load_average: float) -> None:
    """Put `ordinary_client_plan`'s rows into serve_load.json in place of their earlier runs; the others stay."""
    saved = json.loads(RESULTS.read_text())
    saved.pop("machine")
    keys = {tuple(r[k] for k in ROW_KEY) for r in rows}
    kept = [r for r in saved.pop("rows") if tuple(r.get(k) for k in ROW_KEY) not in keys]
    saved["ordinary_client"] = {
        "wall_s": round(wall_s),
        **quietness(load_average),
        "plan": [asdict(run) for run in ordinary_client_plan()],
        "addresses": address_table(rows),
        "idle_cpu_percent": idle,
    }
    print(f"wrote {write_results('serve_load', kept + rows, **saved)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny-random, inline (1, 64, 256 streams) and baseline (256), 32 tokens")
    parser.add_argument("--ordinary-client", action="store_true", help="only the httpx client's runs (make run's address, the replica's port, Serve's proxy)")
    args = parser.parse_args(argv)
    plan = quick_plan() if args.quick else ordinary_client_plan() if args.ordinary_client else full_plan()
    load_average = os.getloadavg()[0]
    started = time.monotonic()
    rows, idle, autoscaling = run_plan(plan)
    print_table(rows)
    ratios = baseline_ratios(rows)
    for table in (ratios, proxy_table(rows), address_table(rows), idle, autoscaling_table(autoscaling)):
        print()
        print_table(table)
    if args.ordinary_client:
        merge_ordinary_client(rows, idle, time.monotonic() - started, load_average)
        return
    summary = {
        "wall_s": round(time.monotonic() - started),
        **quietness(load_average),
        "main_proxy": MAIN_PROXY,
        "proxy_options": {name: env for name, env in PROXY_OPTIONS.items()},
        "plan": [asdict(run) for run in plan],
        "baseline_ratio": ratios,
        "autoscaling": autoscaling,
        "idle_cpu_percent": idle,
    }
    print(f"wrote {write_results('serve_load', rows, quick=args.quick, **summary)}")
    plot_rows(rows, RESULTS_DIR / "serve_load.png", MAIN_PROXY)


if __name__ == "__main__":
    main()
