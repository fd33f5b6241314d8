"""bfloat16 matmuls on AMX for a step's prompt tokens, in fixed tiles of rows so that each row's result is its own.

On a CPU with AMX tiles (Intel Sapphire Rapids and later) oneDNN multiplies bfloat16 matrices
several times faster than any float32 path: four projection shapes of the default model at 512
rows in 1.4 ms against 9.7 for the 4-bit kernel. But which kernel oneDNN runs, and so each
output's summation order, depends on the number of rows: measured with torch 2.13 here, a row's
outputs differ in the last bit between a call of M rows and one of M' rows, for multiples of 16,
32 or 64 too. Called only on tiles of exactly one size (the last one padded with zeros), on a
weight prepacked once, a row's outputs are the same whichever tile of that size it falls in, at
whichever place, beside whatever rows (`tests/engine/test_prompt_tiles.py`). Tiles cost some of
the speed (those shapes at 512 rows in 3.1 ms in 128-row tiles against 1.4 in one call), and a
prompt shorter than its tile pays for the whole tile: a prompt of `SHORT_PROMPT_TOKENS` or more
takes tiles of `ROW_TILE` rows, a shorter one tiles of `SHORT_PROMPT_ROW_TILE` (the model's
projections at 10 rows in 0.60 ms against 0.52 for the float32 kernel and 0.95 in 128-row tiles).

A step's rows are split by position and prompt length (`MatmulRows`): prompt tokens take their
prompt's tiles, everything else (decode tokens, verified drafts, outputs recomputed after a
preemption) the float32 kernel, so how a token is computed depends on the token and its request
alone, never on the batch. The activations and outputs of the tiles are rounded to bfloat16 and
the weights are the quantized blocks' values rounded to bfloat16: prompt tokens' keys, values and
first logits move by bfloat16's rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

ROW_TILE = 128
"""Rows of a oneDNN call for a prompt of `SHORT_PROMPT_TOKENS` or more; the weight is prepacked for it."""
SHORT_PROMPT_ROW_TILE = 32
"""Rows of a oneDNN call for a shorter prompt: a lone chat's 10-token prompt pays for 32 rows, not 128."""
SHORT_PROMPT_TOKENS = 64
TILES_MEMORY_FRACTION = 0.25
"""By default the tiles are made only while their bfloat16 weights take at most this share of the host's available memory."""


def tile_rows_for(prompt_tokens: int) -> int:
    """The tile size of a prompt of ``prompt_tokens`` tokens: a property of the request alone, so a row's bits are too."""
    return SHORT_PROMPT_ROW_TILE if prompt_tokens < SHORT_PROMPT_TOKENS else ROW_TILE


def cpu_has_amx() -> bool:
    """Whether this CPU has AMX bfloat16 tiles and torch has oneDNN's prepacked linear."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in flags and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@dataclass(frozen=True)
class RowGroup:
    """Rows of a step's flat batch computed alike: in bfloat16 tiles of ``tile_rows`` rows, or (0) by the float32 kernel.

    rows: a slice where they are one run (a step's decode tokens come first, its prompt chunks after
    them: a view instead of a gather, 4-5x cheaper at 500 rows), else [R] int64 row indices.
    """

    tile_rows: int
    rows: slice | torch.Tensor


@dataclass(frozen=True)
class MatmulRows:
    """How a step's linear layers compute each row: its rows split into `RowGroup`s."""

    groups: tuple[RowGroup, ...]

    @staticmethod
    def of(tile_rows: torch.Tensor) -> MatmulRows | None:
        """From tile_rows: [T] int64 (host), each row's tile size (0: float32); None if no row takes tiles."""
        if not tile_rows.any():
            return None
        groups = []
        for size in tile_rows.unique().tolist():
            indices = (tile_rows == size).nonzero().flatten()
            first, end = int(indices[0]), int(indices[-1]) + 1
            groups.append(RowGroup(size, slice(first, end) if end - first == len(indices) else indices))
        return MatmulRows(tuple(groups))


class PromptTiles:
    """``x @ W.T`` in bfloat16 tiles of `ROW_TILE` rows, W prepacked once (see the module)."""

    def __init__(self, weight: torch.Tensor) -> None:
        """weight: [N, K] float32."""
        self.out_features, self.in_features = weight.shape
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.to(torch.bfloat16), ROW_TILE)

    def matmul(self, x: torch.Tensor, tile_rows: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """x: [T, K] float32 -> [T, N] float32 (computed in bfloat16, ``tile_rows`` rows a call), written into ``out``
        if given (a view of a larger result)."""
        num_rows = x.shape[0]
        padded_rows = -(-num_rows // tile_rows) * tile_rows
        tiles_in = x.new_empty(padded_rows, self.in_features, dtype=torch.bfloat16)
        tiles_in[:num_rows] = x
        tiles_in[num_rows:] = 0
        out = x.new_empty(num_rows, self.out_features) if out is None else out
        for start in range(0, num_rows, tile_rows):
            tile_out = torch.ops.mkldnn._linear_pointwise(tiles_in[start : start + tile_rows], self.packed, None, "none", [], "")
            out[start : start + tile_rows] = tile_out[: num_rows - start]
        return out
