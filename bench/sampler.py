"""Sampler latency: ours against a sort-based torch reference, on the same logits.

``python -m bench.sampler [--quick] [--device D] [--batch B ...] [--vocab V ...] [--budget-s S] [--profile-calls N] [--out PATH]``
prints a table and writes bench/results/sampler.json (or ``--out``) with rows {device, batch, vocab, config, ours_ms, reference_ms,
kernel, passes_mean, passes_max, counted_passes_mean}, torch's intra-op thread count and the machine's quietness (load
average when it began).

The pass columns are the Triton kernel's reads of [B, V] per row (`bench.lib.sampler_passes`): on the CPU the kernel
runs under ``TRITON_INTERPRET=1`` on the first ``--pass-rows`` rows (a row's passes do not depend on the others)
and its loads are counted; on CUDA every row reports its own count. ``ours_ms`` is the CPU's torch path on the
CPU and the Triton path on CUDA.

``--profile-calls N`` adds ``profiles``: at the largest batch and vocabulary, N calls of ours and of the
reference per configuration under torch's profiler (`bench.lib.step_profile`): wall against device-busy time
per call, the kernels, and the host's operators and CUDA runtime calls, which tell the kernels' own time
from the launches around them.

The reference is what vLLM runs without FlashInfer or its Triton top-k/top-p: penalties
from per-step bin counts, temperature, min-p, a full sort of the vocabulary for
top-k/top-p with a cumsum, softmax, and an exponential-race draw with per-row
generators for seeded rows. Ours is `sampling.Sampler` (including its bookkeeping).

Logits are synthetic but LM-shaped: a Zipf(1.5) profile over a random permutation of
the vocabulary plus Gaussian noise (most of the mass in the top few dozen tokens).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from bench.lib.common import print_table, quietness, write_results
from bench.lib.sampler_passes import interpreter_ready, kernel_passes
from bench.lib.step_profile import profile_calls, profile_lines, profile_row
from sampling.batch import SamplingBatch
from sampling.params import SamplingParams
from sampling.sampler import Sampler

BATCHES = (1, 32, 256)
VOCABS = (49152, 128256, 151936)
PROMPT_LEN = 64
HISTORY = 32
PASS_ROWS = 8


def config_params(name: str, row: int) -> SamplingParams:
    """The request at ``row`` for benchmark configuration ``name``."""
    if name == "greedy":
        return SamplingParams(temperature=0.0)
    if name == "temperature":
        return SamplingParams(temperature=0.8)
    if name == "top_p":
        return SamplingParams(top_p=0.9)
    if name == "top_k_top_p":
        return SamplingParams(top_k=50, top_p=0.9)
    if name == "min_p":
        return SamplingParams(min_p=0.05)
    if name == "penalties_top_p":
        return SamplingParams(top_p=0.9, repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.5)
    if name == "mixed_seeded":
        kinds = [
            SamplingParams(temperature=0.0),
            SamplingParams(top_p=0.9, seed=row),
            SamplingParams(top_k=50, top_p=0.95, temperature=0.8),
        ]
        return kinds[row % 3]
    raise ValueError(name)


CONFIGS = ("greedy", "temperature", "top_p", "top_k_top_p", "min_p", "penalties_top_p", "mixed_seeded")


def lm_like_logits(batch: int, vocab: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """[batch, vocab] float32 logits with a Zipf(1.5) profile, shuffled per row, plus N(0, 0.5) noise."""
    g = torch.Generator().manual_seed(seed)
    profile = -1.5 * torch.log(torch.arange(1, vocab + 1, dtype=torch.float32))
    perm = torch.argsort(torch.rand(batch, vocab, generator=g), dim=-1)
    logits = profile[perm] + 0.5 * torch.randn(batch, vocab, generator=g)
    return logits.to(device)


def reference_sampler(params: list[SamplingParams], prompts: torch.Tensor, outputs: torch.Tensor) -> Callable:
    """A sort-based torch pipeline (vLLM's fallback path) for fixed per-row params; returns f(logits) -> ids."""
    device = prompts.device
    f32 = dict(dtype=torch.float32, device=device)
    temperature = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params], **f32)
    greedy = torch.tensor([p.is_greedy for p in params], device=device)
    top_k = torch.tensor([p.top_k if p.top_k > 0 else 0 for p in params], device=device)
    top_p = torch.tensor([p.top_p for p in params], **f32)
    min_p = torch.tensor([p.min_p for p in params], **f32)
    rep = torch.tensor([p.repetition_penalty for p in params], **f32)
    pres = torch.tensor([p.presence_penalty for p in params], **f32)
    freq = torch.tensor([p.frequency_penalty for p in params], **f32)
    generators = {i: torch.Generator(device).manual_seed(p.seed) for i, p in enumerate(params) if p.seed is not None}
    use_penalties = any(p.repetition_penalty != 1 or p.presence_penalty or p.frequency_penalty for p in params)
    use_top_k, use_top_p = bool((top_k > 0).any()), bool((top_p < 1).any())
    use_min_p, all_greedy = bool((min_p > 0).any()), bool(greedy.all())

    def sample(logits: torch.Tensor) -> torch.Tensor:
        logits = logits.float()
        if use_penalties:
            counts = torch.zeros_like(logits).scatter_add_(1, outputs, torch.ones_like(outputs, dtype=logits.dtype))
            prompt_mask = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, prompts, True)
            seen = counts > 0
            penalised = torch.where(logits > 0, logits / rep[:, None], logits * rep[:, None])
            logits = torch.where(seen | prompt_mask, penalised, logits)
            logits = logits - freq[:, None] * counts - pres[:, None] * seen.float()
        argmax = logits.argmax(dim=-1)
        if all_greedy:
            return argmax
        logits = logits / temperature[:, None]
        if use_min_p:
            probs = logits.softmax(dim=-1)
            logits = logits.masked_fill(probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True), float("-inf"))
        if use_top_k or use_top_p:
            logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
            if use_top_k:
                k = torch.where(top_k > 0, top_k, logits.shape[1])
                kth = logits_sort.gather(1, (logits.shape[1] - k)[:, None])
                logits_sort.masked_fill_(logits_sort < kth, float("-inf"))
            if use_top_p:
                cumulative = logits_sort.softmax(dim=-1).cumsum(dim=-1)
                mask = cumulative <= 1 - top_p[:, None]
                mask[:, -1] = False
                logits_sort.masked_fill_(mask, float("-inf"))
            logits = logits_sort.scatter(-1, logits_idx, logits_sort)
        probs = logits.softmax(dim=-1)
        q = torch.empty_like(probs).exponential_()
        for i, generator in generators.items():
            q[i].exponential_(generator=generator)
        return torch.where(greedy, argmax, probs.div(q).argmax(dim=-1))

    return sample


def time_ms(fn: Callable[[], object], device: torch.device, min_reps: int, budget_s: float) -> float:
    """Fastest wall time of ``fn`` in ms after a warm-up: at least ``min_reps`` runs, more (up to 50)
    while within ``budget_s``. The minimum, because a shared machine only ever adds time."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    times: list[float] = []
    began = time.perf_counter()
    while len(times) < min_reps or (time.perf_counter() - began < budget_s and len(times) < 50):
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1000)
    return min(times)


@dataclass
class Setup:
    """One configuration's inputs: B requests with a prompt and HISTORY sampled tokens each, and their logits."""

    params: list[SamplingParams]
    prompts: torch.Tensor
    """[B, PROMPT_LEN] int64."""
    outputs: torch.Tensor
    """[B, HISTORY] int64."""
    batch: SamplingBatch
    rows: torch.Tensor
    """[B] int64."""
    logits: torch.Tensor
    """[B, V] float32."""


def setup(batch_size: int, vocab: int, config: str, device: torch.device) -> Setup:
    params = [config_params(config, r) for r in range(batch_size)]
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, vocab, (batch_size, PROMPT_LEN), generator=g).to(device)
    outputs = torch.randint(0, vocab, (batch_size, HISTORY), generator=g).to(device)
    batch = SamplingBatch(batch_size, vocab, PROMPT_LEN + HISTORY + 64, device)
    for r, p in enumerate(params):
        batch.add_request(r, p, prompts[r].tolist())
    rows = torch.arange(batch_size, device=device)
    for t in range(HISTORY):
        batch.record(rows, outputs[:, t])
    return Setup(params, prompts, outputs, batch, rows, lm_like_logits(batch_size, vocab, device))


def bench_one(batch_size: int, vocab: int, config: str, device: torch.device, budget_s: float, pass_rows: int) -> dict[str, object]:
    s = setup(batch_size, vocab, config, device)
    sampler = Sampler()
    reference = reference_sampler(s.params, s.prompts, s.outputs)
    ours_ms = time_ms(lambda: sampler(s.logits, s.rows, s.batch), device, 3, budget_s)
    reference_ms = time_ms(lambda: reference(s.logits), device, 3, budget_s)
    counted = s if device.type == "cuda" else setup(min(batch_size, pass_rows), vocab, config, device)
    passes = kernel_passes(counted.logits, counted.rows, counted.batch) if pass_rows > 0 else {}
    return {
        "device": str(device),
        "batch": batch_size,
        "vocab": vocab,
        "config": config,
        "ours_ms": round(ours_ms, 3),
        "reference_ms": round(reference_ms, 3),
        **passes,
    }


def profile_one(batch_size: int, vocab: int, config: str, device: torch.device, calls: int) -> list[dict[str, object]]:
    """Ours and the reference, ``calls`` calls each under the profiler, after a warm-up call."""
    s = setup(batch_size, vocab, config, device)
    sampler, reference = Sampler(), reference_sampler(s.params, s.prompts, s.outputs)
    entries = []
    for name, call in (("ours", lambda: sampler(s.logits, s.rows, s.batch)), ("reference", lambda: reference(s.logits))):
        call()
        profiled = profile_row(partial(profile_calls, call, calls, device.type == "cuda"))
        entries.append({"batch": batch_size, "vocab": vocab, "config": config, "sampler": name, **profiled})
    return entries


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="batch 1 and 32, vocab 49152, fewer timed runs (< 1 min)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", nargs="+", type=int, default=None, help=f"default {BATCHES} (quick: 1 32)")
    parser.add_argument("--vocab", nargs="+", type=int, default=None, help=f"default {VOCABS} (quick: 49152)")
    parser.add_argument("--budget-s", type=float, default=None, help="seconds of timed runs per measurement after 3 (default 1, quick 0.2)")
    parser.add_argument("--profile-calls", type=int, default=0, help="profile this many calls per configuration at the largest batch and vocabulary")
    parser.add_argument("--out", type=Path, default=None, help="the JSON's path (default bench/results/sampler.json)")
    parser.add_argument("--pass-rows", type=int, default=PASS_ROWS, help=f"rows whose kernel passes are counted on the CPU (default {PASS_ROWS}; 0: none)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    pass_rows = args.pass_rows if interpreter_ready() else 0
    load_before = os.getloadavg()[0]
    batches = args.batch or ((1, 32) if args.quick else BATCHES)
    vocabs = args.vocab or ((49152,) if args.quick else VOCABS)
    budget_s = args.budget_s if args.budget_s is not None else (0.2 if args.quick else 1.0)
    rows = []
    for vocab in vocabs:
        for batch_size in batches:
            for config in CONFIGS:
                row = bench_one(batch_size, vocab, config, device, budget_s, pass_rows)
                rows.append(row)
                speedup = row["reference_ms"] / row["ours_ms"]  # type: ignore[operator]
                print(f"{config:>16} batch {batch_size:>3} vocab {vocab:>6}: ours {row['ours_ms']:9.2f} ms, "
                      f"reference {row['reference_ms']:9.2f} ms ({speedup:.1f}x), kernel passes "
                      f"{row.get('passes_mean')} (max {row.get('passes_max')})", flush=True)  # fmt: skip
    profiles = (
        [entry for config in CONFIGS for entry in profile_one(max(batches), max(vocabs), config, device, args.profile_calls)] if args.profile_calls else []
    )
    for entry in profiles:
        print(f"profile: {entry['sampler']} {entry['config']} batch {entry['batch']} vocab {entry['vocab']}")
        print("\n".join(profile_lines(entry, shown=4)))
    print()
    print_table([{**r, "speedup": round(r["reference_ms"] / r["ours_ms"], 2)} for r in rows])  # type: ignore[operator]
    extra = {
        "device_name": device_name(device),
        "quick": args.quick,
        "budget_s": budget_s,
        "logits": "Zipf(1.5) profile + N(0, 0.5) noise",
        "threads": torch.get_num_threads(),
        "pass_rows": pass_rows if device.type == "cpu" else "all",
        **quietness(load_before),
        **({"profiles": profiles} if args.profile_calls else {}),
    }
    path = write_results("sampler", rows, args.out, **extra)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
