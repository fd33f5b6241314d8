"""Routing by prefix against least-loaded: time to first token and prefix-cache hit rate on several engines.

``python -m bench.routing [--quick] [--model M] [--clients N] [--slacks 4 ...] [--workloads ...] [--rounds 1] [--duration-s 15] [--warmup-s 5] [--app-option KEY=VALUE ...] [--out PATH]``

Starts Ray on loopback and, for each workload of `bench.lib.prefix_workloads` and each routing
variant (``engine_routing=least_loaded``, and ``prefix`` with each ``engine_routing_load_slack`` of
``--slacks``), deploys the app afresh (``--model``, ``tiny-random`` by default, `NUM_ENGINES` engines of one torch thread
each, so every unit starts with cold caches) and runs `Scale.clients` closed-loop clients, each
sending a streamed completion of a token-id prompt (greedy, ``ignore_eos``, `MAX_TOKENS` tokens) as
soon as its last one ended. The variants take turns in an order that alternates from workload to
workload and round to round, so that a drift in the machine's load does not favour one. Each
engine's KV cache holds `Scale.cached_prefixes` of the long prefixes: fewer than ``many_prefixes``
has, more than its share of them under prefix routing (`Scale.kv_cache_memory`, from the model's
block size in bytes). A unit warms up for ``--warmup-s`` (caches fill) and is measured for ``--duration-s``: the requests sent in that window, and the engines'
prefix-cache counters (``spout:prefix_cache_queries_total`` and ``spout:prefix_cache_hits_total``
on the app's /metrics) and the ingress's ``spout:engine_routing_total`` over it. Every variant sees
the same prompts.

Rows (bench/results/routing.json), pooled over the rounds: ``policy``, ``load_slack``,
``workload``, ``requests``, ``ttft_p50_ms``, ``ttft_p90_ms``, ``prefix_hit_rate`` (prompt tokens the
engines found cached over those they looked up), ``tokens_per_s`` (output), ``prompt_tokens_per_s``,
``failed``, ``engine_shares`` (each engine's part of the prompt tokens), ``placements``; then the
goal's ratios (``least_loaded`` over ``prefix`` TTFT p50 per workload, at each slack). The machine
has 2 cores for 4 engines, the ingress, Ray and the client: every figure moves with its load,
recorded per unit. tiny-random's prefill is so cheap that a cache hit saves little of a request's
time here; ``--model smollm2-135m-instruct`` (the default model, its prompt tokens in the bfloat16
tiles) measures the same policies where a 1,024-token prefix costs what it does on a real model.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import torch
from prometheus_client.parser import text_string_to_metric_families

from bench.lib.common import print_table, quietness, write_results
from bench.lib.load_client import StreamResult, stream_one
from bench.lib.prefix_workloads import PromptShape, PromptSource, WorkloadName, chat_header
from bench.lib.serve_cluster import ServeCluster
from bench.serve_load import HOST, MAIN_PROXY, warm_up
from deployments import build_app
from deployments.config import ServeArgs
from deployments.engine_routing import Placement, RoutingPolicy
from engine.config import EngineConfig
from engine.kv.kv_cache import bytes_per_block
from engine.loader.checkpoint import load_checkpoint

MODEL = "tiny-random"
"""The default ``--model``."""
NUM_ENGINES = 4
BLOCK_SIZE = EngineConfig.block_size
"""The engines' KV block size (positions), the default."""
MAX_TOKENS = 8
WARMUP_S = 5.0
"""The default ``--warmup-s``."""
TIMEOUT_S = 120


@dataclass(frozen=True)
class Scale:
    """How big a run is: ``--quick`` or the full one."""

    shape: PromptShape
    cached_prefixes: int
    """Long prefixes one engine's KV cache holds (beside the blocks its running requests write)."""
    clients: int
    duration_s: float

    def kv_cache_memory(self, block_bytes: int) -> int:
        """Bytes for `cached_prefixes` whole prompts and outputs, at ``block_bytes`` a block of `BLOCK_SIZE` positions."""
        blocks_per_prefix = -(-(self.shape.prefix_tokens + self.shape.suffix_tokens + MAX_TOKENS) // BLOCK_SIZE)
        return self.cached_prefixes * blocks_per_prefix * block_bytes


FULL = Scale(PromptShape(prefix_tokens=1024, suffix_tokens=16, num_prefixes=48), cached_prefixes=24, clients=32, duration_s=15.0)
QUICK = Scale(PromptShape(prefix_tokens=256, suffix_tokens=16, num_prefixes=16), cached_prefixes=8, clients=8, duration_s=4.0)


@dataclass(frozen=True)
class Variant:
    """A routing policy, and for ``prefix`` its load slack."""

    policy: RoutingPolicy
    load_slack: int | None = None

    def options(self) -> dict[str, object]:
        slack = {} if self.load_slack is None else {"engine_routing_load_slack": self.load_slack}
        return {"engine_routing": str(self.policy)} | slack


@dataclass
class Window:
    """What the clients saw in one unit's measured window, and the counters' change over it."""

    results: list[StreamResult] = field(default_factory=list)
    prompt_tokens: int = 0
    seconds: float = 0.0
    queried: list[float] = field(default_factory=lambda: [0.0] * NUM_ENGINES)
    hits: list[float] = field(default_factory=lambda: [0.0] * NUM_ENGINES)
    placements: list[float] = field(default_factory=lambda: [0.0] * len(Placement))
    load_averages: list[float] = field(default_factory=list)

    def add(self, other: Window) -> None:
        self.results += other.results
        self.prompt_tokens += other.prompt_tokens
        self.seconds += other.seconds
        for name in ("queried", "hits", "placements"):
            setattr(self, name, [a + b for a, b in zip(getattr(self, name), getattr(other, name))])
        self.load_averages += other.load_averages


async def drive(port: int, model: str, source: PromptSource, clients: int, warmup_s: float, duration_s: float) -> Window:
    """``clients`` closed-loop clients for ``warmup_s + duration_s``; the window's results, and the
    counters' change from its start to its end (after the last request sent in it ended)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    window_start, window_end = start + warmup_s, start + warmup_s + duration_s
    window = Window(seconds=duration_s)
    counters: dict[str, dict] = {}

    async def client(index: int) -> None:
        rng = random.Random(f"{source.workload}-{index}")
        while (sent := loop.time()) < window_end:
            prompt = source.next(rng)
            body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}
            result = await stream_one(HOST, port, body | {"stream": True, "stream_options": {"include_usage": True}})
            if sent >= window_start:
                window.results.append(result)
                window.prompt_tokens += len(prompt)

    async def snapshot_at_window_start() -> None:
        await asyncio.sleep(warmup_s)
        counters["start"] = await cache_counters(port)

    await asyncio.wait_for(asyncio.gather(snapshot_at_window_start(), *(client(i) for i in range(clients))), warmup_s + duration_s + TIMEOUT_S)
    end = await cache_counters(port)
    start = counters["start"]
    window.queried, window.hits, window.placements = ([b - a for a, b in zip(start[k], end[k])] for k in ("queries", "hits", "placements"))
    window.load_averages.append(round(os.getloadavg()[0], 2))
    return window


async def cache_counters(port: int) -> dict[str, list[float]]:
    """From the app's /metrics: per engine, the prompt tokens looked up in its prefix cache and those
    found; and the requests routed by placement (`deployments.engine_routing.Placement`)."""
    async with httpx.AsyncClient(timeout=30) as http:
        text = (await http.get(f"http://{HOST}:{port}/metrics")).text
    counters = {"queries": [0.0] * NUM_ENGINES, "hits": [0.0] * NUM_ENGINES, "placements": [0.0] * len(Placement)}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for kind in ("queries", "hits"):
                if sample.name == f"spout:prefix_cache_{kind}_total":
                    counters[kind][int(sample.labels["engine"])] = sample.value
            if sample.name == "spout:engine_routing_total":
                counters["placements"][list(Placement).index(Placement(sample.labels["placement"]))] += sample.value
    return counters


def row_of(variant: Variant, workload: WorkloadName, window: Window) -> dict[str, object]:
    ok = [r for r in window.results if not r.failed and r.ttft_s is not None]
    ttfts = sorted(r.ttft_s for r in ok)
    queried = sum(window.queried)
    return {
        "policy": str(variant.policy),
        "load_slack": variant.load_slack,
        "workload": str(workload),
        "requests": len(ok),
        "ttft_p50_ms": round(statistics.median(ttfts) * 1000, 1) if ttfts else None,
        "ttft_p90_ms": round(ttfts[int(0.9 * (len(ttfts) - 1))] * 1000, 1) if ttfts else None,
        "prefix_hit_rate": round(sum(window.hits) / max(queried, 1), 3),
        "tokens_per_s": round(sum(r.tokens for r in ok) / window.seconds, 1),
        "prompt_tokens_per_s": round(window.prompt_tokens / window.seconds, 1),
        "failed": len(window.results) - len(ok),
        "engine_shares": [round(q / max(queried, 1), 2) for q in window.queried],
        "placements": {str(p): int(n) for p, n in zip(Placement, window.placements)},
        "load_averages": window.load_averages,
    }


def run_units(
    options: dict[str, object], scale: Scale, workloads: list[WorkloadName], variants: list[Variant], rounds: int, warmup_s: float
) -> dict[tuple[Variant, WorkloadName], Window]:
    """Every (workload, variant) unit ``rounds`` times, each on a fresh app of ``options``; the windows pooled per unit."""
    model = str(options["model"])
    header = chat_header(model)
    pooled: dict[tuple[Variant, WorkloadName], Window] = {}
    with ServeCluster(MAIN_PROXY) as cluster:
        for round_index in range(rounds):
            for workload_index, workload in enumerate(workloads):
                order = variants if (round_index + workload_index) % 2 == 0 else variants[::-1]
                for variant in order:
                    port = cluster.deploy(build_app(options | variant.options()), "spout")
                    warm_up(port, model)
                    source = PromptSource(workload, scale.shape, header, seed=workload_index)
                    window = asyncio.run(drive(port, model, source, scale.clients, warmup_s, scale.duration_s))
                    cluster.delete("spout")
                    print_table([row_of(variant, workload, window) | {"round": round_index}])
                    pooled.setdefault((variant, workload), Window()).add(window)
    return pooled


def app_options(model: str, scale: Scale) -> dict[str, object]:
    """Every unit's app: ``model`` on `NUM_ENGINES` engines whose caches hold ``scale``'s `Scale.cached_prefixes`."""
    block_bytes = bytes_per_block(load_checkpoint(model).config, BLOCK_SIZE, torch.float32)
    return {
        "model": model,
        "num_engines": NUM_ENGINES,
        "engine_cpu_threads": 1,
        "max_num_seqs": 64,
        "max_model_len": 2048,
        "kv_cache_memory": scale.kv_cache_memory(block_bytes),
    }


def ratios(rows: list[dict[str, object]]) -> dict[str, object]:
    """Per workload and slack: least_loaded's TTFT p50 over prefix's (above 1: prefix is faster), and tokens/s the other way."""
    least = {r["workload"]: r for r in rows if r["policy"] == "least_loaded"}
    out: dict[str, object] = {}
    for row in rows:
        base = least.get(row["workload"])
        if row["policy"] == "prefix" and base and row["ttft_p50_ms"] and base["ttft_p50_ms"]:
            out[f"{row['workload']} slack {row['load_slack']}"] = {
                "least_loaded_over_prefix_ttft_p50": round(base["ttft_p50_ms"] / row["ttft_p50_ms"], 2),
                "prefix_over_least_loaded_tokens_per_s": round(row["tokens_per_s"] / max(base["tokens_per_s"], 1e-9), 3),
                "prefix_hit_rate": row["prefix_hit_rate"],
            }
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small prompts, few clients, short windows")
    parser.add_argument("--model", default=MODEL, help="the engines' model (default tiny-random)")
    parser.add_argument("--warmup-s", type=float, default=WARMUP_S, help="each unit's warm-up before its window (caches fill)")
    parser.add_argument("--clients", type=int, help="closed-loop clients (default the scale's)")
    default_slack = ServeArgs.model_fields["engine_routing_load_slack"].default
    parser.add_argument("--slacks", nargs="+", type=int, default=[default_slack], help="engine_routing_load_slack values of the prefix policy")
    parser.add_argument("--no-least-loaded", action="store_true", help="only the prefix policy")
    parser.add_argument("--workloads", nargs="+", default=[str(w) for w in WorkloadName], choices=[str(w) for w in WorkloadName])
    parser.add_argument("--rounds", type=int, default=1, help="repetitions of every unit, pooled")
    parser.add_argument("--duration-s", type=float, help="the measured window per unit")
    parser.add_argument("--app-option", action="append", default=[], metavar="KEY=VALUE", help="another app option for every unit")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    more = dict(option.split("=", 1) for option in args.app_option)
    scale = QUICK if args.quick else FULL
    scale = Scale(scale.shape, scale.cached_prefixes, args.clients or scale.clients, args.duration_s or scale.duration_s)
    variants = [Variant(RoutingPolicy.PREFIX, slack) for slack in args.slacks]
    if not args.no_least_loaded:
        variants.append(Variant(RoutingPolicy.LEAST_LOADED))
    load_before = os.getloadavg()[0]
    workloads = [WorkloadName(w) for w in args.workloads]
    options = app_options(args.model, scale) | more
    pooled = run_units(options, scale, workloads, variants, args.rounds, args.warmup_s)
    rows = [row_of(variant, workload, pooled[variant, workload]) for workload in workloads for variant in variants]
    print_table(rows)
    goal = ratios(rows)
    print(goal)
    extra = {
        **quietness(load_before),
        "load_average_after": round(os.getloadavg()[0], 2),
        "model": args.model,
        "num_engines": NUM_ENGINES,
        "rounds": args.rounds,
        "scale": asdict(scale) | {"kv_cache_memory": options["kv_cache_memory"], "max_tokens": MAX_TOKENS, "warmup_s": args.warmup_s},
        "app_options": options,
        "chat_header_tokens": len(chat_header(args.model)),
        "ratios": goal,
    }
    default_out = Path(__file__).resolve().parent / "results" / "routing_quick.json" if args.quick else None
    print(f"wrote {write_results('routing', rows, args.out or default_out, **extra)}")


if __name__ == "__main__":
    main()
