"""Structured outputs in the engine: decode tokens/s with and without a JSON-schema constraint, and the mask's cost per step.

At batch 1, 32 and 256 on tiny-random and the default model, every request samples at
temperature 1 for the same number of tokens, either free (``ignore_eos``) or constrained to
an array of at least 100 orders (`bench.grammar`'s schema: nested objects, a pattern, an enum,
numbers), which it cannot finish within the budget. Per decode step: the time llguidance's worker spends filling
the bitmasks (beside the forward pass) and the time the engine thread then still waits for
them and sends them to the device (the cost it adds to a step).

    python -m bench.structured [--quick] [--models tiny-random,smollm2-135m-instruct]

Writes bench/results/structured.json.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

from bench.grammar import SCHEMA as ORDER_SCHEMA
from bench.lib.common import device_label, print_table, quietness, write_results
from engine.config import DEFAULT_MODEL, EngineConfig
from engine.core import EngineCore
from engine.loader.checkpoint import load_checkpoint
from engine.loader.random_shapes import TINY_RANDOM
from sampling.params import SamplingParams

BATCHES = (1, 32, 256)
SCHEMA = {"type": "array", "items": ORDER_SCHEMA, "minItems": 100}
"""An array of at least 100 orders: no request finishes it within its tokens."""


def _timed(owner: object, name: str, totals: dict[str, float]) -> None:
    """Wrap ``owner.name`` so that its wall time adds to ``totals[name]``."""
    original: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            totals[name] = totals.get(name, 0.0) + time.perf_counter() - started

    setattr(owner, name, wrapper)


def measure(engine: EngineCore, batch: int, prompt_len: int, decode_tokens: int, constrained: bool, totals: dict[str, float]) -> dict[str, float]:
    """Decode tokens/s and mask ms per decode step for ``batch`` requests started together."""
    structured = {"json": SCHEMA} if constrained else None
    for index in range(batch):
        params = SamplingParams(temperature=1.0, seed=index, max_tokens=decode_tokens + 1, ignore_eos=not constrained, structured_outputs=structured)
        prompt = [(7 * index + 13 * position) % 40000 + 100 for position in range(prompt_len)]
        engine.add_request(f"r{index}", prompt, params)
    while engine.num_waiting:  # grammars compiling, then the prefill step (every prompt fits its token budget)
        engine.step()
    totals.clear()
    totals.update({"_fill": 0.0, "_grammar_mask": 0.0})
    started, generated, steps = time.perf_counter(), 0, 0
    while engine.has_unfinished_requests():
        generated += sum(len(o.new_token_ids) for o in engine.step())
        steps += 1
    decode_s = time.perf_counter() - started
    return {
        "decode_tokens_per_s": round(generated / decode_s, 1),
        "mask_fill_ms_per_step": round(totals["_fill"] / steps * 1e3, 3),
        "mask_wait_ms_per_step": round(totals["_grammar_mask"] / steps * 1e3, 3),
        "step_ms": round(decode_s / steps * 1e3, 2),
    }


def run_model(model: str, prompt_len: int, decode_tokens: int) -> list[dict[str, object]]:
    config = EngineConfig(
        model=model,
        max_num_seqs=max(BATCHES),
        max_model_len=prompt_len + decode_tokens + 8,
        max_num_batched_tokens=max(BATCHES) * prompt_len,
    )
    engine = EngineCore(config, load_checkpoint(model))
    totals: dict[str, float] = {}
    _timed(engine.constrained.filler, "_fill", totals)
    _timed(engine.runner, "_grammar_mask", totals)
    measure(engine, 1, prompt_len, 2, True, totals)  # warm-up: builds llguidance's tokenizer and caches the schema
    rows = []
    for batch in BATCHES:
        for constrained in (False, True):
            result = measure(engine, batch, prompt_len, decode_tokens, constrained, totals)
            rows.append({"device": device_label(engine.runner.device), "model": model, "batch": batch, "json_schema": constrained} | result)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 decode tokens instead of 32")
    parser.add_argument("--models", default=f"{TINY_RANDOM},{DEFAULT_MODEL}")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    prompt_len, decode_tokens = 16, 8 if args.quick else 32
    rows = [row for model in args.models.split(",") for row in run_model(model, prompt_len, decode_tokens)]
    print_table(rows)
    path = write_results("structured", rows, **quietness(load_before), prompt_len=prompt_len, decode_tokens=decode_tokens, quick=args.quick)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
