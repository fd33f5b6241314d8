"""Launch `top_set_sample_kernel`: min-p / top-k / top-p rows and greedy rows, temperature applied inside."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from sampling.batch import RowParams
from sampling.features import Feature
from sampling.triton.top_set import top_set_sample_kernel

TOP_SET_STAGES = frozenset({Feature.MIN_P, Feature.TOP_K, Feature.TOP_P})
"""The truncations this kernel handles; any other goes to `truncate_and_draw_kernel`."""
NUM_BINS = 64
"""Bins of the top-k radix select: 6 bits of the bracket per pass."""
BLOCK_V = 4096
INTERPRETER_ELEMENTS = 2**20
"""The interpreter runs programs one after another with numpy, so it gets many rows per program (and
whole rows); a GPU gets one row per program. A row's result is the same either way."""


@dataclass(frozen=True)
class TopSetDraw:
    """The kernel's outputs for n rows."""

    token_ids: torch.Tensor
    """[n] int64: the drawn token (greedy rows: the first argmax)."""
    passes: torch.Tensor
    """[n] int32: how many times the kernel read the row (1 for greedy rows)."""


def block_sizes(num_rows: int, vocab_size: int, interpret: bool) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_V): one row per program and 4096-token chunks on a GPU; large tiles in the interpreter."""
    if not interpret:
        return 1, min(triton.next_power_of_2(vocab_size), BLOCK_V)
    block_v = min(triton.next_power_of_2(vocab_size), INTERPRETER_ELEMENTS // 4)
    rows = max(1, min(INTERPRETER_ELEMENTS // block_v, INTERPRETER_ELEMENTS // (2 * NUM_BINS)))
    return min(triton.next_power_of_2(num_rows), rows), block_v


def top_set_sample(
    logits: torch.Tensor, p: RowParams, random_keys: torch.Tensor, stages: frozenset[Feature], blocks: tuple[int, int] | None = None
) -> TopSetDraw:
    """Temperature, the ``stages`` (a subset of `TOP_SET_STAGES`) and the draw for every row in one launch;
    greedy rows get their first argmax.

    logits: [n, V] float32 (row stride any, unit column stride); p: the rows' parameters; random_keys [n]
    uint32-in-int64, the unseeded rows' keys (`seeded_noise.random_keys`; the kernel computes the seeded rows' own);
    blocks: (BLOCK_R, BLOCK_V) instead of `block_sizes` (tests run the GPU's tiling in the interpreter).
    """
    assert stages <= TOP_SET_STAGES, stages
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    n, vocab = logits.shape
    tokens = torch.empty(n, dtype=torch.int64, device=logits.device)
    passes = torch.empty(n, dtype=torch.int32, device=logits.device)
    block_r, block_v = blocks or block_sizes(n, vocab, triton.knobs.runtime.interpret)
    columns = (p.temperature, p.is_greedy, p.min_p, p.top_k, p.top_p, p.seed_key, p.has_seed, p.output_pos, random_keys)
    top_set_sample_kernel[(triton.cdiv(n, block_r),)](
        logits, logits.stride(0), *(c.contiguous() for c in columns), tokens, passes, n, vocab,
        HAS_MIN_P=Feature.MIN_P in stages, HAS_TOP_K=Feature.TOP_K in stages, HAS_TOP_P=Feature.TOP_P in stages,
        BLOCK_R=block_r, BLOCK_V=block_v, NUM_BINS=NUM_BINS, num_warps=8 if block_v >= 4096 else 4,
    )  # fmt: skip
    return TopSetDraw(tokens, passes)
