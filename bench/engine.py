"""Engine throughput: prefill and decode tokens/s at batch 1, 16, 64 and 256, per model and dtype.

``python -m bench.engine [--quick] [--model M ...] [--dtype D ...] [--weights W ...] [--cpu-threads N] [--device D] [--profile-steps N] [--out PATH]``
runs each model in float32 (the reference; the CPU's default) and in bfloat16 (CUDA's default,
`engine.model_runner.resolve_device`; on a CPU with AMX tiles it runs the matmuls there), on CUDA eagerly and with decode
steps replayed from CUDA graphs; a GGUF's quantized matrices in float32 on the CPU both through
their blocks (``quantized``, the default, `engine.models.quant_linear`) and dequantized to float32
at load (``dequantized``); prints a table and writes bench/results/engine.json (or ``--out``)
with rows {device, model, dtype, default_dtype, cuda_graphs, quantized_weights, threads, phase, batch, tokens_per_s,
step_ms, cpu_ms}: ``cpu_ms`` is the process's CPU time per step (all its threads), which a loaded machine
inflates less than ``step_ms`` when the engine runs on one thread (``--cpu-threads 1``). ``--profile-steps N``
adds ``profiles``: for each run, N decode steps at the smallest and largest batch under torch's profiler
(`bench.lib.step_profile`: wall and device-busy time per step, top kernels, host operators and CUDA
runtime calls), which `make gpu-check` asks for to see what a step's time is on a GPU. A random-weights model (`engine.loader.random_weights`) has its
weights made on the device it runs on: an 8B shape in bfloat16 takes 16 GB there and none on the host.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from functools import partial
from pathlib import Path

import torch

from bench.lib.common import device_label, print_table, quietness, write_results
from bench.lib.step_profile import profile_decode, profile_lines, profile_row
from engine.config import DEFAULT_MODEL, EngineConfig
from engine.core import EngineCore
from engine.loader.checkpoint import Checkpoint, load_checkpoint, random_checkpoint
from engine.loader.random_shapes import RANDOM_MODEL_SHAPES
from engine.model_runner import resolve_device
from sampling.params import SamplingParams

BATCHES = (1, 16, 64, 256)
DTYPES = ("float32", "bfloat16")
WEIGHTS = ("quantized", "dequantized")


def measure(engine: EngineCore, batch: int, prompt_len: int, decode_tokens: int) -> tuple[float, float, float, float]:
    """(prefill tokens/s, decode tokens/s, prefill CPU s, decode CPU s per step) for ``batch`` requests
    started together. With async scheduling (CUDA) the prefill's time includes launching the first decode step."""
    params = SamplingParams(temperature=0.0, max_tokens=decode_tokens + 1, ignore_eos=True)
    for index in range(batch):
        prompt = [(7 * index + 13 * position) % 40000 + 100 for position in range(prompt_len)]
        engine.add_request(f"r{index}", prompt, params)
    started, cpu_started = time.perf_counter(), time.process_time()
    first: list = []
    while not first:  # one prefill step (every prompt fits its token budget); async scheduling returns it a step later
        first = engine.step()
    prefill_s, prefill_cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    assert len(first) == batch, "prefill did not fit in one step"
    started, cpu_started = time.perf_counter(), time.process_time()
    generated = 0
    while engine.has_unfinished_requests():
        generated += sum(len(o.new_token_ids) for o in engine.step())
    decode_s = time.perf_counter() - started
    return batch * prompt_len / prefill_s, generated / decode_s, prefill_cpu_s, (time.process_time() - cpu_started) * batch / generated


def model_checkpoint(model: str, device: torch.device, dtypes: list[str]) -> Checkpoint:
    """Random weights are made on the device, in the narrowest dtype every run can take."""
    if model not in RANDOM_MODEL_SHAPES:
        return load_checkpoint(model)
    return random_checkpoint(model, device=device, dtype=torch.float32 if "float32" in dtypes else torch.bfloat16)


def bench_model(
    model: str, args: argparse.Namespace, prompt_len: int, decode_tokens: int, repeats: int
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """The rows of ``model``'s runs, and their decode profiles (when ``--profile-steps`` asks)."""
    device = resolve_device(EngineConfig(device=args.device))[0]
    checkpoint = model_checkpoint(model, device, args.dtype)
    rows: list[dict[str, object]] = []
    profiles: list[dict[str, object]] = []
    runs = [(dtype, graphs, weights) for dtype in args.dtype for graphs in ((False, True) if device.type == "cuda" else (False,)) for weights in args.weights]
    for dtype, cuda_graphs, weights in runs:
        if weights == "quantized" and (dtype != "float32" or device.type != "cpu" or not checkpoint.quantized) and "dequantized" in args.weights:
            continue  # nothing to keep quantized: the dequantized run is the same
        config = EngineConfig(
            model=model,
            dtype=dtype,
            device=args.device,
            max_num_seqs=max(args.batch),
            max_model_len=prompt_len + decode_tokens + 8,
            max_num_batched_tokens=max(args.batch) * prompt_len,
            enable_prefix_caching=False,  # every run repeats the same prompts: measure their prefill, not cache hits
            cuda_graphs=cuda_graphs,
            quantized_weights=weights == "quantized",
            cpu_threads=args.cpu_threads,
        )
        engine = EngineCore(config, checkpoint)
        rows += bench_engine(engine, args, prompt_len, decode_tokens, repeats)
        if args.profile_steps:
            labels = {key: rows[-1][key] for key in ("model", "dtype", "cuda_graphs", "quantized_weights")}
            for batch in sorted({min(args.batch), max(args.batch)}):
                profiled = profile_row(partial(profile_decode, engine, batch, prompt_len, args.profile_steps))
                profiles.append({**labels, "batch": batch, **profiled})
        del engine
        gc.collect()  # the engine's KV cache and graphs go before the next one allocates its own
    del checkpoint
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows, profiles


def bench_engine(engine: EngineCore, args: argparse.Namespace, prompt_len: int, decode_tokens: int, repeats: int) -> list[dict[str, object]]:
    config = engine.config
    labels = {"device": device_label(engine.runner.device), "model": config.model, "dtype": config.dtype}
    labels["default_dtype"] = str(resolve_device(EngineConfig(device=args.device))[1]).removeprefix("torch.") == config.dtype
    labels["cuda_graphs"] = engine.runner.decode_graphs is not None
    labels["quantized_weights"] = engine.runner.quantized
    labels["threads"] = torch.get_num_threads() if engine.runner.device.type == "cpu" else None
    measure(engine, 1, prompt_len, 2)  # warm-up
    rows: list[dict[str, object]] = []
    for batch in args.batch:
        # Median of several runs: the first run of a shape allocates.
        runs = [measure(engine, batch, prompt_len, decode_tokens) for _ in range(repeats)]
        prefill, decode, prefill_cpu, decode_cpu = (statistics.median(run[index] for run in runs) for index in range(4))
        rows.append(
            {
                **labels,
                "phase": "prefill",
                "batch": batch,
                "tokens_per_s": round(prefill, 1),
                "step_ms": round(1000 * batch * prompt_len / prefill, 3),
                "cpu_ms": round(1000 * prefill_cpu, 3),
            }
        )
        rows.append(
            {
                **labels,
                "phase": "decode",
                "batch": batch,
                "tokens_per_s": round(decode, 1),
                "step_ms": round(1000 * batch / decode, 3),
                "cpu_ms": round(1000 * decode_cpu, 3),
            }
        )
        print(
            f"{config.model} {config.dtype} graphs {labels['cuda_graphs']} quantized {labels['quantized_weights']} batch {batch}: prefill {prefill:.0f} tokens/s, decode {decode:.0f} tokens/s",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short prompts and few decode steps (under a minute on CPU)")
    parser.add_argument("--model", nargs="+", default=[DEFAULT_MODEL])
    parser.add_argument("--dtype", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument(
        "--weights", nargs="+", default=list(WEIGHTS), choices=WEIGHTS, help="a GGUF's quantized matrices kept in blocks, or dequantized at load"
    )
    parser.add_argument("--batch", nargs="+", type=int, default=list(BATCHES))
    parser.add_argument("--device", default=None)
    parser.add_argument("--cpu-threads", type=int, default=None, help="torch threads on the CPU (default every core)")
    parser.add_argument("--profile-steps", type=int, default=0, help="profile this many decode steps of each run at the smallest and largest batch")
    parser.add_argument("--out", type=Path, default=None, help="the JSON's path (default bench/results/engine.json)")
    args = parser.parse_args(argv)
    prompt_len, decode_tokens, repeats = (32, 8, 1) if args.quick else (128, 32, 3)
    load_average_before = os.getloadavg()[0]
    rows: list[dict[str, object]] = []
    profiles: list[dict[str, object]] = []
    for model in args.model:
        model_rows, model_profiles = bench_model(model, args, prompt_len, decode_tokens, repeats)
        rows, profiles = rows + model_rows, profiles + model_profiles
    print_table(rows)
    for entry in profiles:
        print(f"profile: {entry['model']} {entry['dtype']} graphs {entry['cuda_graphs']}, decode at batch {entry['batch']}")
        print("\n".join(profile_lines(entry)))
    extra = {"profiles": profiles} if args.profile_steps else {}
    path = write_results(
        "engine",
        rows,
        args.out,
        prompt_len=prompt_len,
        decode_tokens=decode_tokens,
        repeats=repeats,
        quick=args.quick,
        **quietness(load_average_before),
        **extra,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
