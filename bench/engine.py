"""Engine throughput: prefill and decode tokens/s at batch 1, 16, 64 and 256, per model and dtype.

``python -m bench.engine [--quick] [--model M ...] [--dtype D ...] [--device D] [--out PATH]`` runs
each model in float32 (the reference) and in bfloat16, which the engine picks by default on CUDA
and on CPUs with AMX tiles (`engine.model_runner.resolve_device`), on CUDA eagerly and with decode
steps replayed from CUDA graphs; prints a table and writes bench/results/engine.json (or ``--out``)
with rows {device, model, dtype, default_dtype, cuda_graphs, phase, batch, tokens_per_s, step_ms}. A random-weights model (`engine.loader.random_weights`) has its
weights made on the device it runs on: an 8B shape in bfloat16 takes 16 GB there and none on the host.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from pathlib import Path

import torch

from bench.common import device_label, print_table, quietness, write_results
from engine.config import DEFAULT_MODEL, EngineConfig
from engine.core import EngineCore
from engine.loader.checkpoint import Checkpoint, load_checkpoint, random_checkpoint
from engine.loader.random_weights import RANDOM_MODEL_SHAPES
from engine.model_runner import resolve_device
from sampling.params import SamplingParams

BATCHES = (1, 16, 64, 256)
DTYPES = ("float32", "bfloat16")


def measure(engine: EngineCore, batch: int, prompt_len: int, decode_tokens: int) -> tuple[float, float]:
    """(prefill tokens/s, decode tokens/s) for ``batch`` requests started together. With async
    scheduling (CUDA) the prefill's time includes launching the first decode step."""
    params = SamplingParams(temperature=0.0, max_tokens=decode_tokens + 1, ignore_eos=True)
    for index in range(batch):
        prompt = [(7 * index + 13 * position) % 40000 + 100 for position in range(prompt_len)]
        engine.add_request(f"r{index}", prompt, params)
    started = time.perf_counter()
    first: list = []
    while not first:  # one prefill step (every prompt fits its token budget); async scheduling returns it a step later
        first = engine.step()
    prefill_s = time.perf_counter() - started
    assert len(first) == batch, "prefill did not fit in one step"
    started = time.perf_counter()
    generated = 0
    while engine.has_unfinished_requests():
        generated += sum(len(o.new_token_ids) for o in engine.step())
    decode_s = time.perf_counter() - started
    return batch * prompt_len / prefill_s, generated / decode_s


def model_checkpoint(model: str, device: torch.device, dtypes: list[str]) -> Checkpoint:
    """Random weights are made on the device, in the narrowest dtype every run can take."""
    if model not in RANDOM_MODEL_SHAPES:
        return load_checkpoint(model)
    return random_checkpoint(model, device=device, dtype=torch.float32 if "float32" in dtypes else torch.bfloat16)


def bench_model(model: str, args: argparse.Namespace, prompt_len: int, decode_tokens: int, repeats: int) -> list[dict[str, object]]:
    device = resolve_device(EngineConfig(device=args.device))[0]
    checkpoint = model_checkpoint(model, device, args.dtype)
    rows: list[dict[str, object]] = []
    for dtype in args.dtype:
        for cuda_graphs in (False, True) if device.type == "cuda" else (False,):
            config = EngineConfig(
                model=model,
                dtype=dtype,
                device=args.device,
                max_num_seqs=max(args.batch),
                max_model_len=prompt_len + decode_tokens + 8,
                max_num_batched_tokens=max(args.batch) * prompt_len,
                enable_prefix_caching=False,  # every run repeats the same prompts: measure their prefill, not cache hits
                cuda_graphs=cuda_graphs,
            )
            rows += bench_engine(EngineCore(config, checkpoint), args, prompt_len, decode_tokens, repeats)
            gc.collect()  # the engine's KV cache and graphs go before the next one allocates its own
    del checkpoint
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def bench_engine(engine: EngineCore, args: argparse.Namespace, prompt_len: int, decode_tokens: int, repeats: int) -> list[dict[str, object]]:
    config = engine.config
    labels = {"device": device_label(engine.runner.device), "model": config.model, "dtype": config.dtype}
    labels["default_dtype"] = str(resolve_device(EngineConfig(device=args.device))[1]).removeprefix("torch.") == config.dtype
    labels["cuda_graphs"] = engine.runner.decode_graphs is not None
    measure(engine, 1, prompt_len, 2)  # warm-up
    rows: list[dict[str, object]] = []
    for batch in args.batch:
        # Median of several runs: the first run of a shape allocates.
        runs = [measure(engine, batch, prompt_len, decode_tokens) for _ in range(repeats)]
        prefill, decode = statistics.median(run[0] for run in runs), statistics.median(run[1] for run in runs)
        rows.append({**labels, "phase": "prefill", "batch": batch, "tokens_per_s": round(prefill, 1), "step_ms": round(1000 * batch * prompt_len / prefill, 3)})
        rows.append({**labels, "phase": "decode", "batch": batch, "tokens_per_s": round(decode, 1), "step_ms": round(1000 * batch / decode, 3)})
        print(
            f"{config.model} {config.dtype} graphs {labels['cuda_graphs']} batch {batch}: prefill {prefill:.0f} tokens/s, decode {decode:.0f} tokens/s",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short prompts and few decode steps (under a minute on CPU)")
    parser.add_argument("--model", nargs="+", default=[DEFAULT_MODEL])
    parser.add_argument("--dtype", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--batch", nargs="+", type=int, default=list(BATCHES))
    parser.add_argument("--device", default=None)
    parser.add_argument("--out", type=Path, default=None, help="the JSON's path (default bench/results/engine.json)")
    args = parser.parse_args(argv)
    prompt_len, decode_tokens, repeats = (32, 8, 1) if args.quick else (128, 32, 3)
    load_average_before = os.getloadavg()[0]
    rows = [row for model in args.model for row in bench_model(model, args, prompt_len, decode_tokens, repeats)]
    print_table(rows)
    path = write_results(
        "engine", rows, args.out, prompt_len=prompt_len, decode_tokens=decode_tokens, repeats=repeats, quick=args.quick, **quietness(load_average_before)
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
