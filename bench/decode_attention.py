"""Decode step time with and without the CPU paged-attention kernel, in one process.

``python -m bench.decode_attention [--batches 1 16 64 256] [--prompt-len 64] [--repeats 10] [--threads 1] [--attention-lens 72 512] [--out PATH]``
fills the engine (the default model, float32 on the CPU) with ``batch`` greedy requests of
``prompt-len`` random tokens, runs their prefill steps, then times decode-only steps with the
model runner's ``paged_decode_kernel`` on and off, interleaved (this machine's timings vary up to
2x between processes, so both variants are measured in one process, each repeat one step of
each, in alternating order), and reports the min over repeats per variant, ms per step, of wall
time and of the process's CPU time (which a loaded machine inflates less). Each toggled step's tokens are
appended as usual, so later repeats attend a few positions more. Then the decode attention alone
(every layer, on the engine's cache, random blocks) at ``attention-lens`` positions, the part
of the step the kernel replaces, measured the same way. Prints a table and writes
bench/results/decode_attention.json (rows: part, batch, positions, kernel_ms, gather_sdpa_ms and
the CPU ms of the steps).
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path

import torch

from bench.lib.common import print_table, quietness, write_results
from engine.config import DEFAULT_MODEL, EngineConfig
from engine.core import EngineCore
from engine.loader.checkpoint import load_checkpoint
from engine.models.attention_metadata import ScheduledChunk, build_attention_metadata
from engine.models.llama import decode_attention, gather_attention
from sampling.params import SamplingParams


def decode_only(engine: EngineCore) -> None:
    """Step until the scheduler has no prefill left (every request is decoding)."""
    while any(request.num_computed_tokens < len(request.prompt_token_ids) for request in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()


def timed_step(engine: EngineCore, kernel: bool) -> tuple[float, float]:
    """(wall, CPU) seconds of one decode step with the kernel on or off."""
    engine.runner.paged_decode_kernel = kernel
    wall, cpu = time.perf_counter(), time.process_time()
    engine.step()
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(engine: EngineCore, batch: int, prompt_len: int, repeats: int) -> dict[str, float]:
    """Min ms per decode step of ``batch`` sequences, wall and CPU time, kernel on (``kernel``) and off (``sdpa``)."""
    rng = random.Random(batch)
    params = SamplingParams(temperature=0.0, max_tokens=2 * repeats + 4, ignore_eos=True)
    for index in range(batch):
        engine.add_request(f"{batch}-{index}", [rng.randrange(3, 2000) for _ in range(prompt_len)], params)
    decode_only(engine)
    times: dict[str, list[tuple[float, float]]] = {"kernel": [], "sdpa": []}
    for repeat in range(repeats):
        for kernel in (True, False) if repeat % 2 == 0 else (False, True):  # neither always first
            times["kernel" if kernel else "sdpa"].append(timed_step(engine, kernel))
    while engine.has_unfinished_requests():
        engine.step()
    return {f"{name} {clock}": 1000 * min(pair[index] for pair in pairs) for name, pairs in times.items() for index, clock in enumerate(("wall", "cpu"))}


def attention_ms(engine: EngineCore, batch: int, seq_len: int, repeats: int) -> dict[str, float]:
    """Min ms of one step's decode attention alone (every layer's cache) for ``batch`` sequences of
    ``seq_len`` positions on random blocks: the kernel (``kernel``) against gather and SDPA (``sdpa``), interleaved."""
    cache, config = engine.runner.kv_cache, engine.runner.model.config
    generator = torch.Generator().manual_seed(seq_len)
    num_blocks = -(-seq_len // cache.block_size)
    tables = torch.randint(cache.num_blocks, (batch, num_blocks), generator=generator)  # blocks may repeat: only read
    chunks = [ScheduledChunk(tuple(table.tolist()), seq_len - 1, 1) for table in tables]
    group = build_attention_metadata(chunks, cache.block_size, torch.device("cpu"), decode_kernel=True).groups[0]
    q = torch.randn(batch, config.num_heads, config.head_dim, generator=generator)
    variants = {
        "kernel": lambda keys, values: decode_attention(q, keys, values, group),
        "sdpa": lambda keys, values: gather_attention(q[:, :, None], keys, values, group),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, attend in variants.items():
            started = time.perf_counter()
            for keys, values in zip(cache.keys, cache.values):
                attend(keys, values)
            times[name].append(time.perf_counter() - started)
    return {name: 1000 * min(values) for name, values in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--attention-lens", type=int, nargs="+", default=[72, 512])
    parser.add_argument("--out", type=Path, default=None, help="the JSON's path (default bench/results/decode_attention.json)")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    config = EngineConfig(model=DEFAULT_MODEL, dtype="float32", device="cpu", cpu_threads=args.threads, max_num_seqs=max(args.batches))
    engine = EngineCore(config, load_checkpoint(DEFAULT_MODEL))
    assert engine.runner.paged_decode_kernel, "the kernel is not built here"
    print(f"{DEFAULT_MODEL}, float32, {torch.get_num_threads()} thread(s), prompts of {args.prompt_len} tokens, min of {args.repeats} interleaved repeats")
    rows: list[dict[str, object]] = []
    for batch in args.batches:
        r = measure(engine, batch, args.prompt_len, args.repeats)
        rows.append(
            {
                "part": "decode step",
                "batch": batch,
                "positions": None,
                "kernel_ms": r["kernel wall"],
                "gather_sdpa_ms": r["sdpa wall"],
                "kernel_cpu_ms": r["kernel cpu"],
                "gather_sdpa_cpu_ms": r["sdpa cpu"],
            }
        )
    for batch in args.batches:
        for seq_len in args.attention_lens:
            cell = attention_ms(engine, batch, seq_len, args.repeats)
            rows.append(
                {
                    "part": f"attention, {engine.runner.model.config.num_layers} layers",
                    "batch": batch,
                    "positions": seq_len,
                    "kernel_ms": cell["kernel"],
                    "gather_sdpa_ms": cell["sdpa"],
                    "kernel_cpu_ms": None,
                    "gather_sdpa_cpu_ms": None,
                }
            )
    print_table(rows)
    extra = {"model": DEFAULT_MODEL, "threads": torch.get_num_threads(), "prompt_len": args.prompt_len, "repeats": args.repeats, **quietness(load_before)}
    print("wrote", write_results("decode_attention", rows, args.out, **extra))


if __name__ == "__main__":
    main()
