"""Priority scheduling at twice an engine's capacity: time to first token and tokens/s per priority.

``python -m bench.priority [--model tiny-random] [--max-num-seqs 16] [--duration-s 20] [--out PATH]``

In process, no Ray (the queue's order is the engine's): ``2 * max_num_seqs`` clients each keep one
request outstanding (a new one as soon as the last finished), so half of them wait at any time.
The clients are spread evenly over priorities 0, 1 and 2 (0 first, as vLLM's). Each policy runs in
turn: ``fcfs`` (the same load, every request at priority 0, rows labelled by the class its client
belongs to) and ``priority``. A third workload, ``burst``, runs under ``priority``: one client keeps
``2 * max_num_seqs`` requests outstanding while ``max_num_seqs / 2`` others keep one each, all at
priority 0: the others' time to first token shows whether the burst starves them (their fair share).

Writes bench/results/priority.json with rows {workload, policy, priority, client (the burst workload's
groups), requests (those whose first token came in the measured window), ttft_p50_ms, ttft_p90_ms,
tokens_per_s, waiting_at_end, longest_wait_ms (requests still without a token when the run ended: a
priority starved by those above it has no TTFT, only this)} and the load average (the machine is shared: the engine's
step times, and so every figure, rise with the load; the ratios between priorities are what holds).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.lib.common import print_table, quietness, write_results
from engine.config import EngineConfig
from engine.core import EngineCore
from engine.fair_share import SchedulingPolicy
from engine.loader.checkpoint import load_checkpoint
from engine.loader.random_shapes import TINY_RANDOM
from sampling.params import SamplingParams

PRIORITIES = (0, 1, 2)
MAX_TOKENS = 32
PROMPT_TOKENS = (16, 48)
WARMUP_S = 2.0


@dataclass
class Client:
    name: str
    priority: int
    outstanding: int
    """Requests it keeps in flight."""


@dataclass
class Tally:
    ttft_s: list[float] = field(default_factory=list)
    tokens: int = 0
    waiting_s: list[float] = field(default_factory=list)
    """How long each request still without a token at the end had waited."""


def run(engine: EngineCore, clients: list[Client], use_priority: bool, duration_s: float, rng: random.Random) -> dict[str, Tally]:
    """Drive the engine with ``clients`` for ``duration_s`` after a warm-up; a tally per client group
    (the priority, or the client's name for the burst workload)."""
    added: dict[str, tuple[float, Client]] = {}
    first_token_seen: set[str] = set()
    tallies: dict[str, Tally] = {_group(client, clients): Tally() for client in clients}
    count = 0

    def submit(client: Client) -> None:
        nonlocal count
        count += 1
        request_id = f"{client.name}-{count}"
        prompt = [rng.randrange(1, 1000) for _ in range(rng.randint(*PROMPT_TOKENS))]
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, priority=client.priority if use_priority else 0)
        engine.add_request(request_id, prompt, params, client=client.name)
        added[request_id] = (time.perf_counter(), client)

    for client in clients:
        for _ in range(client.outstanding):
            submit(client)
    start = time.perf_counter()
    measured_from, end = start + WARMUP_S, start + WARMUP_S + duration_s
    while (now := time.perf_counter()) < end:
        for output in engine.step():
            sent, client = added[output.request_id]
            group = tallies[_group(client, clients)]
            if now >= measured_from:
                group.tokens += len(output.new_token_ids)
                if output.new_token_ids and output.request_id not in first_token_seen and sent >= measured_from:
                    group.ttft_s.append(time.perf_counter() - sent)
            if output.new_token_ids:
                first_token_seen.add(output.request_id)
            if output.finish_reason is not None:
                del added[output.request_id]
                first_token_seen.discard(output.request_id)
                submit(client)
    for request_id, (sent, client) in added.items():
        if request_id not in first_token_seen:
            tallies[_group(client, clients)].waiting_s.append(end - sent)
    engine.abort_requests(list(added))
    while engine.has_unfinished_requests():
        engine.step()
    return dict(tallies)


def _group(client: Client, clients: list[Client]) -> str:
    """Rows are per priority, except in the burst workload (every client at priority 0): the burst, and the others."""
    if all(c.priority == 0 for c in clients) and any(c.outstanding > 1 for c in clients):
        return "burst" if client.outstanding > 1 else "others"
    return str(client.priority)


def rows_of(workload: str, policy: str, tallies: dict[str, Tally], duration_s: float) -> list[dict[str, object]]:
    rows = []
    for group, tally in sorted(tallies.items()):
        ttft = sorted(tally.ttft_s)
        rows.append(
            {
                "workload": workload,
                "policy": policy,
                "priority": int(group) if group.isdigit() else 0,
                "client": None if group.isdigit() else group,
                "requests": len(ttft),
                "ttft_p50_ms": round(statistics.median(ttft) * 1000, 1) if ttft else None,
                "ttft_p90_ms": round(ttft[int(0.9 * (len(ttft) - 1))] * 1000, 1) if ttft else None,
                "tokens_per_s": round(tally.tokens / duration_s, 1),
                "waiting_at_end": len(tally.waiting_s),
                "longest_wait_ms": round(max(tally.waiting_s) * 1000, 1) if tally.waiting_s else None,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=TINY_RANDOM)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--cpu-threads", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    checkpoint = load_checkpoint(args.model)
    capacity = args.max_num_seqs
    rng = random.Random(0)
    rows: list[dict[str, object]] = []
    by_priority = [Client(f"client{i}", PRIORITIES[i % len(PRIORITIES)], 1) for i in range(2 * capacity)]
    burst = [Client("burst", 0, 2 * capacity)] + [Client(f"other{i}", 0, 1) for i in range(capacity // 2)]
    for workload, clients, policy in (("priorities", by_priority, "fcfs"), ("priorities", by_priority, "priority"), ("burst", burst, "priority")):
        config = EngineConfig(
            model=args.model,
            max_num_seqs=capacity,
            max_model_len=256,
            scheduling_policy=SchedulingPolicy(policy),
            cpu_threads=args.cpu_threads,
            dtype="float32",
        )
        engine = EngineCore(config, checkpoint)
        tallies = run(engine, clients, policy == "priority", args.duration_s, rng)
        rows += rows_of(workload, policy, tallies, args.duration_s)
        print(f"{workload} / {policy} done", flush=True)
    print_table(rows)
    extra = {
        **quietness(load_before),
        "load_average_after": round(os.getloadavg()[0], 2),
        "capacity": f"max_num_seqs {capacity}, {2 * capacity} clients with one request outstanding each (twice the capacity)",
        "model": args.model,
        "max_tokens": MAX_TOKENS,
        "duration_s": args.duration_s,
    }
    path = write_results("priority", rows, args.out, **extra)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
