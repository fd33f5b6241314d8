"""Noisy neighbour: what one heavy but legal request costs 32 ordinary streams.

``python -m bench.noisy_neighbour`` starts Ray and the app (``tiny-random``) on loopback and
runs 32 greedy streams of 64 tokens three times: alone, next to one request with
``n`` = 128 choices of long sampled output, and next to one request that speculates
(``num_speculative_tokens`` = 8, which the app allows for this run). The heavy request
starts first and still runs when the streams end (it is then cancelled). Each row reports
the 32 streams' TTFT and inter-token latency p50/p99, their tokens/s, and failed or wrong
streams (each against its non-streaming twin). Rows go to bench/results/noisy_neighbour.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time

from bench.lib.common import print_table, quietness, write_results
from bench.lib.load_client import completion_body, latency_fields, post_json, reference_texts, run_streams
from bench.lib.serve_cluster import ServeCluster
from bench.serve_load import HOST, MAIN_PROXY, warm_up
from deployments import build_app

MODEL = "tiny-random"
NUM_STREAMS = 32
STREAM_TOKENS = 64
HEAVY_START_S = 0.5
"""How long the heavy request runs before the streams start (it is admitted by then)."""
TIMEOUT_S = 600
APP_ARGS = {"model": MODEL, "max_num_seqs": 256, "max_model_len": 1024, "max_choices_per_request": 128, "max_client_speculative_tokens": 8}
NEIGHBOURS: dict[str, dict | None] = {
    "alone": None,
    "next to n=128": {"prompt": "Once upon a time", "n": 128, "max_tokens": 900, "temperature": 1.0, "seed": 1, "ignore_eos": True},
    "next to speculation": {"prompt": "a b c a b c a b c a b c", "max_tokens": 900, "temperature": 0.0, "ignore_eos": True, "num_speculative_tokens": 8},
}


async def streams_next_to(port: int, neighbour: dict | None, references: list[str | None]) -> dict:
    heavy = None
    if neighbour is not None:
        heavy = asyncio.create_task(post_json(HOST, port, {"model": MODEL} | neighbour))
        await asyncio.sleep(HEAVY_START_S)
    bodies = [completion_body(MODEL, i, STREAM_TOKENS, stream=True) for i in range(NUM_STREAMS)]
    results, elapsed = await run_streams(HOST, port, bodies, TIMEOUT_S)
    heavy_still_running = heavy is not None and not heavy.done()
    if heavy is not None:
        heavy.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await heavy
    return latency_fields(results, references, elapsed) | {"neighbour_ran_throughout": heavy is None or heavy_still_running}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="repetitions of each row, pooled")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    rows = []
    with ServeCluster(MAIN_PROXY) as cluster:
        port = cluster.deploy(build_app(APP_ARGS), "spout")
        warm_up(port, MODEL)
        twins = [completion_body(MODEL, i, STREAM_TOKENS, stream=False) for i in range(NUM_STREAMS)]
        references = asyncio.run(reference_texts(HOST, port, twins, NUM_STREAMS, TIMEOUT_S))
        for name, neighbour in NEIGHBOURS.items():
            for round_index in range(args.rounds):
                row = {"neighbour": name, "round": round_index} | asyncio.run(streams_next_to(port, neighbour, references))
                rows.append(row)
                print_table([row])
                time.sleep(1.0)
    print_table(rows)
    print(f"wrote {write_results('noisy_neighbour', rows, model=MODEL, app_args=APP_ARGS, **quietness(load_before))}")


if __name__ == "__main__":
    main()
