"""The engine under concurrency, on its defaults (paged KV cache, max_num_seqs 256, prefix caching).

``python -m bench.engine_concurrency [--quick] [--model M] [--device D] [--out PATH]`` adds N greedy
requests at once and steps until all finish: TTFT (from the start to each request's
first token) p50/p99 and output tokens/s, for distinct 128-token prompts at 64 and 256
sequences (in float32 on the defaults, which on a CPU with AMX compute prompt tokens' matmuls in
bfloat16 tiles; in float32 for every token; in bfloat16), and for prompts that share a 200-token
system prompt with prefix caching on and off. On CUDA each engine first runs as many other prompts of
the same shape, so that Triton's compiles for the workload's shapes fall before the clock. Prints a
table and writes bench/results/engine_concurrency.json (or ``--out``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from bench.lib.common import device_label, print_table, quietness, write_results
from engine.config import DEFAULT_MODEL, EngineConfig
from engine.core import EngineCore
from engine.loader.checkpoint import Checkpoint, load_checkpoint
from sampling.params import SamplingParams

PROMPT_TOKENS = 128
SYSTEM_PROMPT_TOKENS = 200
QUESTION_TOKENS = 16


def distinct_prompts(count: int, first: int = 0) -> list[list[int]]:
    """``count`` prompts of `PROMPT_TOKENS`, no two alike; ``first``: where the numbering starts (another set, none of these)."""
    return [[(7 * index + 13 * position) % 40000 + 100 for position in range(PROMPT_TOKENS)] for index in range(first, first + count)]


def shared_system_prompts(count: int, first: int = 0) -> list[list[int]]:
    system = [(11 * position) % 40000 + 100 for position in range(SYSTEM_PROMPT_TOKENS)]
    return [system + [(17 * index + 5 * position) % 40000 + 100 for position in range(QUESTION_TOKENS)] for index in range(first, first + count)]


def run(engine: EngineCore, prompts: list[list[int]], output_tokens: int) -> dict[str, float]:
    """TTFT percentiles (ms) and output tokens/s for ``prompts`` added at once."""
    params = SamplingParams(temperature=0.0, max_tokens=output_tokens, ignore_eos=True)
    for index, prompt in enumerate(prompts):
        engine.add_request(str(index), prompt, params)
    started = time.perf_counter()
    first_token_s: dict[str, float] = {}
    generated = 0
    while engine.has_unfinished_requests():
        for output in engine.step():
            generated += len(output.new_token_ids)
            first_token_s.setdefault(output.request_id, time.perf_counter() - started)
    elapsed = time.perf_counter() - started
    ttfts = sorted(first_token_s.values())
    return {
        "ttft_p50_ms": round(1000 * statistics.median(ttfts), 1),
        "ttft_p99_ms": round(1000 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))], 1),
        "output_tokens_per_s": round(generated / elapsed, 1),
    }


def measure(
    checkpoint: Checkpoint, config: EngineConfig, workload: str, prompts: list[list[int]], warm_up: list[list[int]], output_tokens: int
) -> dict[str, object]:
    """``warm_up``: as many other prompts of the same shape as ``prompts`` (none cached for them). On CUDA
    they all run first, so that Triton compiles its kernels' specializations for this workload's
    shapes before the clock starts; elsewhere (nothing compiles) the first alone. Either way the
    shared system prompt is then cached, as a live server would have it."""
    engine = EngineCore(config, checkpoint)
    run(engine, warm_up if engine.runner.device.type == "cuda" else warm_up[:1], 2)
    hits_before = engine.prefix_cache_stats.hit_tokens
    queried_before = engine.prefix_cache_stats.queried_tokens
    result = run(engine, prompts, output_tokens)
    queried = engine.prefix_cache_stats.queried_tokens - queried_before
    return {
        "device": device_label(engine.runner.device),
        "dtype": str(engine.runner.dtype).removeprefix("torch."),
        "prompt_tiles": engine.runner.prompt_tiles,
        "workload": workload,
        "concurrency": len(prompts),
        "prefix_caching": config.enable_prefix_caching,
        **result,
        "preemptions": engine.num_preemptions,
        "prefix_hit_rate": round((engine.prefix_cache_stats.hit_tokens - hits_before) / max(queried, 1), 3),
        "kv_blocks": engine.runner.kv_cache.num_blocks,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="16 and 64 sequences, 16 output tokens")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--device", default=None)
    parser.add_argument("--out", type=Path, default=None, help="the JSON's path (default bench/results/engine_concurrency.json)")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    concurrencies, output_tokens = ((16, 64), 16) if args.quick else ((64, 256), 64)
    checkpoint = load_checkpoint(args.model)
    rows = []
    # The CPU's default, float32 for every token where the default took bfloat16 prompt tiles (AMX
    # only: elsewhere, a GPU included, the same run twice), then the GPU's dtype (and AMX's).
    for dtype, prompt_tiles in (("float32", None), ("float32", False), ("bfloat16", None)):
        if prompt_tiles is False and not any(row["prompt_tiles"] for row in rows):
            continue
        config = EngineConfig(model=args.model, device=args.device, dtype=dtype, bf16_prompt_matmuls=prompt_tiles)
        rows += [measure(checkpoint, config, "distinct", distinct_prompts(n), distinct_prompts(n, n), output_tokens) for n in concurrencies]
    count = concurrencies[0]
    shared, shared_warm_up = shared_system_prompts(count), shared_system_prompts(count, count)
    for caching in (True, False):
        caching_config = EngineConfig(model=args.model, device=args.device, enable_prefix_caching=caching)
        rows.append(measure(checkpoint, caching_config, "shared-system-prompt", shared, shared_warm_up, output_tokens))
    print_table(rows)
    path = write_results(
        "engine_concurrency",
        rows,
        args.out,
        prompt_tokens=PROMPT_TOKENS,
        system_prompt_tokens=SYSTEM_PROMPT_TOKENS,
        output_tokens=output_tokens,
        quick=args.quick,
        **quietness(load_before),
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
