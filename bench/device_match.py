"""Greedy tokens on an accelerator against the CPU's, for the same prompts and the same weights.

``python -m bench.device_match [--device cuda] [--model M] [--prompts N] [--tokens T] [--out PATH]``
runs N distinct prompts through the engine greedily, in float32 on the CPU (the reference) and on
``--device`` in float32 and in bfloat16, eagerly and (on CUDA) with decode steps replayed from CUDA
graphs, with the weights made once on the CPU. Each row says, for a device, dtype and graph
setting, how many prompts gave exactly the CPU's tokens and exactly the same device's eager
tokens, and for the others the first position where they differ. float32 is expected to match
(a last-bit difference can only flip a near-tie); bfloat16 is reported, not expected to. Writes
bench/results/device_match.json (or ``--out``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from bench.lib.common import device_label, print_table, write_results
from engine.config import EngineConfig
from engine.core import EngineCore
from engine.loader.checkpoint import Checkpoint, load_checkpoint
from engine.loader.random_shapes import SMOLLM2_SHAPE_RANDOM
from sampling.params import SamplingParams


def greedy_tokens(checkpoint: Checkpoint, device: str, dtype: str, cuda_graphs: bool, prompts: list[list[int]], tokens: int) -> tuple[str, list[list[int]]]:
    """(the device's label, each prompt's greedy tokens), the prompts run together in one batch."""
    config = EngineConfig(
        model=checkpoint.name, device=device, dtype=dtype, max_num_seqs=len(prompts), max_model_len=256, enable_prefix_caching=False, cuda_graphs=cuda_graphs
    )
    engine = EngineCore(config, checkpoint)
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    for index, prompt in enumerate(prompts):
        engine.add_request(str(index), prompt, params)
    generated: dict[str, list[int]] = {str(index): [] for index in range(len(prompts))}
    while engine.has_unfinished_requests():
        for output in engine.step():
            generated[output.request_id] += output.new_token_ids
    return device_label(engine.runner.device), [generated[str(index)] for index in range(len(prompts))]


def graph_settings(device: str) -> tuple[bool, ...]:
    """Eager, and with CUDA graphs where there are any."""
    return (False, True) if torch.device(device).type == "cuda" else (False,)


def first_difference(ours: list[int], reference: list[int]) -> int | None:
    return next((position for position, (a, b) in enumerate(zip(ours, reference)) if a != b), None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", default=SMOLLM2_SHAPE_RANDOM)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=None, help="the JSON's path (default bench/results/device_match.json)")
    args = parser.parse_args(argv)
    checkpoint = load_checkpoint(args.model)
    prompts = [[(31 * index + 7 * position) % 40000 + 100 for position in range(16 + 4 * index)] for index in range(args.prompts)]
    _, reference = greedy_tokens(checkpoint, "cpu", "float32", False, prompts, args.tokens)
    rows = []
    for dtype in ("float32", "bfloat16"):
        runs = {cuda_graphs: greedy_tokens(checkpoint, args.device, dtype, cuda_graphs, prompts, args.tokens) for cuda_graphs in graph_settings(args.device)}
        eager = runs[False][1]
        for cuda_graphs, (label, tokens) in runs.items():
            against_cpu = [first_difference(ours, cpu) for ours, cpu in zip(tokens, reference)]
            against_eager = [first_difference(ours, theirs) for ours, theirs in zip(tokens, eager)]
            rows.append(
                {
                    "device": label,
                    "dtype": dtype,
                    "cuda_graphs": cuda_graphs,
                    "prompts": len(prompts),
                    "same_as_cpu_float32": sum(d is None for d in against_cpu),
                    "first_differences_from_cpu": [d for d in against_cpu if d is not None],
                    "same_as_eager": sum(d is None for d in against_eager),
                }
            )
    print_table(rows)
    path = write_results("device_match", rows, args.out, model=args.model, tokens=args.tokens)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
