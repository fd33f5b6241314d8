"""Egress capacity per GPU, measured with a model-free engine: ``python -m bench.egress_capacity [--quick]``.

A `bench.lib.synthetic_engine.SyntheticEngineActor` emits tokens at a GPU's step rate
(`RATES`: 256 streams at 10 ms steps, 512 at 20 ms: 25,600 tokens/s each) and the real app
(ingress, output router, detokenizer inline or on a pool of one replica, SSE, HAProxy on
Serve's port as ``make run`` serves) streams them to as many concurrent clients, each
reading ``MAX_TOKENS`` tokens of the default model's vocabulary with the raw load client.
The engine runs at most a few steps ahead of what the ingress has routed, so when the
egress cannot keep up the engine slows down to it: the tokens/s the clients receive is
what one ingress replica sustains on this machine, which also runs the clients.

Two workloads (`WORKLOADS`): ``plain``, one choice per stream and nothing but text; ``heavy``, where
the detokenizer has the most to do per token: two choices per stream (``n`` 2, half the streams, so
the engine runs as many sequences), each token's logprobs with 5 alternatives (each one's text
decoded), and 16 stop strings that never match (each checked). SentencePiece byte fallback is not
in it: no such tokenizer is installed with the default model.

Each row has the offered and sustained tokens/s, the engine's steps per second, and the
CPU µs per token of each process kind net of its idle CPU (`bench.lib.process_cpu`). From
those, `sizing` gives the replicas one GPU at that rate needs: an ingress (or detok)
replica is one event loop, kept to `REPLICA_BUSY_TARGET` of a core. Results go to
bench/results/egress_capacity.json; the machine's load average before each row is recorded, and each process's idle CPU, read
after the load, is subtracted.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import time
from dataclasses import asdict, dataclass, field

import ray

from bench.lib.common import RESULTS_DIR, print_table, quietness, write_results
from bench.lib.load_client import completion_body, latency_fields, run_streams
from bench.lib.process_cpu import cpu_seconds, per_token_us
from bench.lib.serve_cluster import FRONTS, ServeCluster, front_options
from bench.lib.synthetic_engine import StepRate, SyntheticEngineActor
from bench.serve_load import idle_cpu_percent, warm_up
from deployments import build_app
from deployments.config import ServeArgs
from deployments.engine_actor import EngineHandle
from deployments.engine_placement import ENGINE_NAMESPACE, engine_name

HOST = "127.0.0.1"
MODEL = "smollm2-135m-instruct"
"""Its tokenizer is what the ingress and the detokenizer use; no model is loaded."""
RATES = (StepRate(256, 0.010), StepRate(512, 0.020))
MAX_TOKENS = 1024
"""Long enough that the burst's start (0.15-0.5 s until every stream has its first token) is a small part of the run."""
DETOK_MODES: dict[str, dict[str, object]] = {
    "inline": {"inline_detok_threshold": 1_000_000, "detok_min_replicas": 0, "detok_max_replicas": 1},
    "pool": {"inline_detok_threshold": 0, "detok_min_replicas": 1, "detok_max_replicas": 1},
}


@dataclass(frozen=True)
class Workload:
    name: str
    choices: int
    """``n``: each stream carries this many sequences, so a rate's streams are its ``max_num_seqs`` / ``choices``."""
    fields: dict[str, object] = field(default_factory=dict)
    """Request fields beyond `completion_body`'s."""


NEVER_SEEN_STOPS = [f"<never {index}>" for index in range(16)]
WORKLOADS = (Workload("plain", 1), Workload("heavy", 2, {"n": 2, "logprobs": 5, "stop": NEVER_SEEN_STOPS}))
REPLICA_BUSY_TARGET = 0.7
"""Of one core, the most an ingress or detok replica (one event loop) is sized to use, leaving room for bursts."""
TIMEOUT_S = 600
SETTLE_S = 2.0


def start_engine(app: str, rate: StepRate, options: dict[str, object]) -> EngineHandle:
    """The synthetic engine under the name the app's ingress (built with ``options``) looks its engine up by."""
    actor = ray.remote(max_concurrency=10_000)(SyntheticEngineActor)
    name = engine_name(app, ServeArgs.from_options(options, os.environ), 0)
    return actor.options(name=name, namespace=ENGINE_NAMESPACE, lifetime="detached", num_cpus=1).remote(rate, 4096)


def measure(cluster: ServeCluster, rate: StepRate, workload: Workload, detok: str, max_tokens: int, front: str) -> tuple[dict, dict]:
    """One rate, workload and detok mode behind ``front``: its row and the idle CPU it was measured against."""
    app = f"{detok}-{workload.name}-{rate.max_num_seqs}"
    options = {"model": MODEL, "max_num_seqs": rate.max_num_seqs, **DETOK_MODES[detok], **front_options(front, cluster.port)}
    engine = start_engine(app, rate, options)
    cluster.deploy(build_app(options), app)
    warm_up(cluster.port, MODEL)
    bodies = [completion_body(MODEL, i, max_tokens, stream=True) | workload.fields for i in range(rate.max_num_seqs // workload.choices)]
    load_average = os.getloadavg()[0]
    steps_before = ray.get(engine.stats.remote())["steps"]
    before = cpu_seconds()
    results, elapsed = asyncio.run(run_streams(HOST, cluster.port, bodies, TIMEOUT_S))
    after = cpu_seconds()
    # Idle after the load, not before: read before it, a new detok replica used 80% of a core (a --quick run).
    time.sleep(SETTLE_S)
    idle = {"workload": workload.name, "detok": detok, "max_num_seqs": rate.max_num_seqs} | idle_cpu_percent()
    idle_cores = {key.removeprefix("idle_pct_"): pct / 100 for key, pct in idle.items() if key.startswith("idle_pct_")}
    cpu = per_token_us(before, after, sum(r.tokens for r in results), idle_cores, elapsed)
    steps = ray.get(engine.stats.remote())["steps"] - steps_before
    cluster.delete(app)
    row = {"workload": workload.name, "detok": detok, "streams": len(bodies), "step_ms": rate.step_s * 1e3, "offered_tokens_per_s": rate.tokens_per_s}
    row |= latency_fields(results, [None] * len(results), elapsed)
    row.pop("wrong_streams")  # the synthetic tokens have no non-streaming twin to compare with
    row |= {"engine_steps_per_s": round(steps / elapsed, 1), "load_average_before": round(load_average, 2), "cpu_us_egress": cpu.pop("egress")}
    return row | {f"cpu_us_{kind}": value for kind, value in cpu.items()}, idle


def sizing(row: dict) -> dict:
    """Replicas one GPU at the row's offered rate needs, from the row's CPU per token (see the module)."""
    cores = {kind: row["offered_tokens_per_s"] * row[f"cpu_us_{kind}"] / 1e6 for kind in ("ingress", "detok", "proxy")}
    return {
        "workload": row["workload"],
        "detok": row["detok"],
        "streams": row["streams"],
        "offered_tokens_per_s": row["offered_tokens_per_s"],
        "ingress_tokens_per_s_per_core": round(1e6 / row["cpu_us_ingress"]) if row["cpu_us_ingress"] else None,
        "ingress_cores": round(cores["ingress"], 2),
        "detok_cores": round(cores["detok"], 2),
        "haproxy_cores": round(cores["proxy"], 2),
        "ingress_replicas": math.ceil(cores["ingress"] / REPLICA_BUSY_TARGET),
        "detok_replicas": math.ceil(cores["detok"] / REPLICA_BUSY_TARGET),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="256 sequences at 10 ms steps only, each workload inline and pool, 64 tokens")
    parser.add_argument("--front", choices=sorted(FRONTS), default="replica", help="the app's HTTP front (its http_front option; make run's is replica)")
    args = parser.parse_args(argv)
    rates = RATES[:1] if args.quick else RATES
    max_tokens = 64 if args.quick else MAX_TOKENS
    load_average = os.getloadavg()[0]
    started = time.monotonic()
    rows, idle = [], []
    with ServeCluster(FRONTS[args.front]) as cluster:
        for rate in rates:
            for workload, detok in ((workload, detok) for workload in WORKLOADS for detok in DETOK_MODES):
                row, idle_row = measure(cluster, rate, workload, detok, max_tokens, args.front)
                print_table([row])
                rows.append(row)
                idle.append(idle_row)
    sizes = [sizing(row) for row in rows]
    for table in (rows, sizes, idle):
        print()
        print_table(table)
    summary = {
        "wall_s": round(time.monotonic() - started),
        **quietness(load_average),
        "quick": args.quick,
        "proxy": FRONTS[args.front],
        "model_tokenizer": MODEL,
        "max_tokens": max_tokens,
        "rates": [asdict(rate) for rate in rates],
        "replica_busy_target": REPLICA_BUSY_TARGET,
        "sizing": sizes,
        "idle_cpu_percent": idle,
    }
    name = "egress_capacity" + ("_replica_front" if args.front == "replica" else "")
    print(f"wrote {write_results('egress_capacity', rows, RESULTS_DIR / f'{name}.json', **summary)}")


if __name__ == "__main__":
    main()
