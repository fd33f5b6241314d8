"""Passes over [B, V] of the sampler's Triton kernel, per configuration (`bench.sampler`'s pass columns).

`kernel_passes` runs `sampling.Sampler` with its Triton path on the benchmark's logits and
records, for each launch of `top_set_sample`, the passes each row's program reports; under
``TRITON_INTERPRET=1`` (the CPU) it also counts the elements the kernel actually loaded from
the logits (`bench.lib.kernel_reads`), so the reported number is checked against what was read.
On CUDA only the kernel's own count is available. Greedy-only batches launch no kernel (the
argmax is one torch reduction).
"""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import torch

from bench.lib.kernel_reads import counting_reads
from sampling.batch import SamplingBatch
from sampling.sampler import Sampler


def interpreter_ready() -> bool:
    """Set ``TRITON_INTERPRET=1`` when no GPU is there; True if the Triton kernels can then run here (Triton is
    installed, and not imported yet: the variable is read when triton decorates its functions)."""
    if importlib.util.find_spec("triton") is None:
        return False
    if torch.cuda.is_available():
        return True
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    if "triton" in sys.modules:
        return False
    os.environ["TRITON_INTERPRET"] = "1"
    return True


def kernel_passes(logits: torch.Tensor, rows: torch.Tensor, batch: SamplingBatch) -> dict[str, object]:
    """Run the Triton sampler once on logits [B, V]; returns the kernel launched ("top_set" or "none"), the
    mean and max passes its rows report, and on the CPU the mean passes counted from its loads."""
    from sampling.triton import top_set_launch

    launches: list[tuple[np.ndarray, np.ndarray | None]] = []
    real = top_set_launch.top_set_sample
    interpret = logits.device.type == "cpu"

    def recorded(lg, p, random_keys, stages):  # noqa: ANN001, ANN202
        if not interpret:
            drawn = real(lg, p, random_keys, stages)
            launches.append((drawn.passes.cpu().numpy(), None))
            return drawn
        with counting_reads(lg) as reads:
            drawn = real(lg, p, random_keys, stages)
        launches.append((drawn.passes.numpy(), reads.passes()))
        return drawn

    top_set_launch.top_set_sample = recorded
    try:
        Sampler(use_triton=True)(logits, rows, batch)
    finally:
        top_set_launch.top_set_sample = real
    if not launches:
        return {"kernel": "none", "passes_mean": 0.0, "passes_max": 0, "counted_passes_mean": 0.0 if interpret else None}
    reported = np.concatenate([r for r, _ in launches])
    counted = None if not interpret else float(np.concatenate([c for _, c in launches if c is not None]).mean())
    return {
        "kernel": "top_set",
        "passes_mean": round(float(reported.mean()), 3),
        "passes_max": int(reported.max()),
        "counted_passes_mean": None if counted is None else round(counted, 3),
    }
