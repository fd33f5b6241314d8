"""Launch `truncate_and_draw_kernel` for a step (the CUDA default; the torch path is its reference)."""

from __future__ import annotations

import torch
import triton

from sampling.batch import RowParams
from sampling.features import Feature
from sampling.ops.draw import Draw
from sampling.triton.kernels import truncate_and_draw_kernel

MAX_BLOCK_V = 4096
TILE_ELEMENTS = 8192
INTERPRETER_TILE_ELEMENTS = 2**20
"""The interpreter runs programs one after another with numpy, so it gets much larger tiles."""


def block_sizes(num_rows: int, vocab_size: int) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_V): a vocabulary chunk of up to 4096, and as many rows as fit a tile."""
    tile = INTERPRETER_TILE_ELEMENTS if triton.knobs.runtime.interpret else TILE_ELEMENTS
    block_v = min(triton.next_power_of_2(vocab_size), MAX_BLOCK_V)
    block_r = min(triton.next_power_of_2(num_rows), max(1, tile // block_v))
    return block_r, block_v


def triton_sample(
    scaled: torch.Tensor,
    p: RowParams,
    row_keys: torch.Tensor,
    stages: frozenset[Feature],
    need_processed: bool,
    drafts: torch.Tensor | None,
) -> Draw:
    """Truncate (all stages in ``stages``) and draw, in one launch; with ``drafts`` [n] (-1: none) accept or recover.

    scaled: [n, V] float32, temperature applied; row_keys [n] uint32-in-int64.
    """
    scaled = scaled.contiguous()
    n, vocab = scaled.shape
    tokens = torch.empty(n, dtype=torch.int64, device=scaled.device)
    processed = torch.empty_like(scaled) if need_processed else tokens
    accepted = torch.empty(n, dtype=torch.int8, device=scaled.device) if drafts is not None else tokens
    columns = (p.min_p, p.top_k, p.top_p, p.typical_p, p.top_n_sigma, p.xtc_threshold, p.xtc_probability)
    block_r, block_v = block_sizes(n, vocab)
    truncate_and_draw_kernel[(triton.cdiv(n, block_r),)](
        scaled, scaled.stride(0), *(c.contiguous() for c in columns), row_keys.contiguous(),
        drafts.contiguous() if drafts is not None else tokens, tokens, accepted, processed, n, vocab,
        HAS_MIN_P=Feature.MIN_P in stages, HAS_TOP_K=Feature.TOP_K in stages, HAS_TOP_P=Feature.TOP_P in stages,
        HAS_TYPICAL_P=Feature.TYPICAL_P in stages, HAS_TOP_N_SIGMA=Feature.TOP_N_SIGMA in stages, HAS_XTC=Feature.XTC in stages,
        HAS_DRAFTS=drafts is not None, WRITE_PROCESSED=need_processed, BLOCK_R=block_r, BLOCK_V=block_v,
    )  # fmt: skip
    return Draw(
        tokens,
        accepted.bool() if drafts is not None else None,
        processed if need_processed else None,
    )
