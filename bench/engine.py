"""Engine throughput: prefill and decode tokens/s at batch 1, 16, 64 and 256, per dtype.

``python -m bench.engine [--quick] [--model M] [--device D]`` runs the model in float32 (the
reference) and in bfloat16, which the engine picks by default on CUDA and on CPUs with AMX tiles
(`engine.model_runner.resolve_device`), prints a table and writes bench/results/engine.json with
rows {device, model, dtype, default_dtype, phase, batch, tokens_per_s}.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench.common import device_label, print_table, quietness, write_results
from engine.config import DEFAULT_MODEL, EngineConfig
from engine.core import EngineCore
from engine.loader.checkpoint import load_checkpoint
from engine.model_runner import resolve_device
from sampling.params import SamplingParams

BATCHES = (1, 16, 64, 256)
DTYPES = ("float32", "bfloat16")


def measure(engine: EngineCore, batch: int, prompt_len: int, decode_tokens: int) -> tuple[float, float]:
    """(prefill tokens/s, decode tokens/s) for ``batch`` requests started together."""
    params = SamplingParams(temperature=0.0, max_tokens=decode_tokens + 1, ignore_eos=True)
    for index in range(batch):
        prompt = [(7 * index + 13 * position) % 40000 + 100 for position in range(prompt_len)]
        engine.add_request(f"r{index}", prompt, params)
    started = time.perf_counter()
    first = engine.step()  # every prompt fits the step's token budget: one prefill step
    prefill_s = time.perf_counter() - started
    assert len(first) == batch, "prefill did not fit in one step"
    started = time.perf_counter()
    generated = 0
    while engine.has_unfinished_requests():
        generated += sum(len(o.new_token_ids) for o in engine.step())
    decode_s = time.perf_counter() - started
    return batch * prompt_len / prefill_s, generated / decode_s


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short prompts and few decode steps (under a minute on CPU)")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    prompt_len, decode_tokens, repeats = (32, 8, 1) if args.quick else (128, 32, 3)
    load_average_before = os.getloadavg()[0]
    checkpoint = load_checkpoint(args.model)
    rows = []
    for dtype in DTYPES:
        config = EngineConfig(
            model=args.model,
            dtype=dtype,
            device=args.device,
            max_num_seqs=max(BATCHES),
            max_model_len=prompt_len + decode_tokens + 8,
            max_num_batched_tokens=max(BATCHES) * prompt_len,
            enable_prefix_caching=False,  # every run repeats the same prompts: measure their prefill, not cache hits
        )
        engine = EngineCore(config, checkpoint)
        labels = {"device": device_label(engine.runner.device), "model": args.model, "dtype": dtype}
        labels["default_dtype"] = str(resolve_device(EngineConfig(device=args.device))[1]).removeprefix("torch.") == dtype
        measure(engine, 1, prompt_len, 2)  # warm-up
        for batch in BATCHES:
            # Median of several runs: the first run of a shape allocates.
            runs = [measure(engine, batch, prompt_len, decode_tokens) for _ in range(repeats)]
            rows.append({**labels, "phase": "prefill", "batch": batch, "tokens_per_s": round(statistics.median(run[0] for run in runs), 1)})
            rows.append({**labels, "phase": "decode", "batch": batch, "tokens_per_s": round(statistics.median(run[1] for run in runs), 1)})
        del engine
    print_table(rows)
    path = write_results(
        "engine", rows, prompt_len=prompt_len, decode_tokens=decode_tokens, repeats=repeats, quick=args.quick, **quietness(load_average_before)
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
