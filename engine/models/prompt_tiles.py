"""bfloat16 matmuls on AMX for a step's prompt tokens, in fixed tiles of rows so that each row's result is its own.

On a CPU with AMX tiles (Intel Sapphire Rapids and later) oneDNN multiplies bfloat16 matrices
several times faster than any float32 path: four projection shapes of the default model at 512
rows in 1.4 ms against 9.7 for the 4-bit kernel. But which kernel oneDNN runs, and so each
output's summation order, depends on the number of rows: measured with torch 2.13 here, a row's
outputs differ in the last bit between a call of 32 rows and one of 128, and between 128 and 512
for some shapes. Called only on tiles whose sizes give the same bits, on a weight prepacked once, a
row's outputs are the same whichever tile it falls in, at whichever place, beside whatever rows
(`tests/engine/test_prompt_tiles.py`). Which sizes those are is measured once per weight shape
(`tile_sizes_for`: those of `TILE_SIZES` whose results on a random probe are `ROW_TILE`'s bit for
bit; here 48 to 128 rows for every projection of the default model, and 256 for three of its four),
since it is oneDNN's choice, not a documented property.

A step's prompt rows are cut into tiles of those sizes (`tile_plan`): the largest while more rows
remain than it holds, then the smallest that holds the rest (zero rows padding it). The default
model's four projections at 512 rows: 4.0 ms so, against 4.6 in 128-row tiles and 7.9 in 32-row
ones; at 10 rows (a lone chat prompt) 0.68 ms in a 48-row tile against 0.61 in a 32-row one.

A step's rows are split by position (`MatmulRows`): prompt tokens take the tiles, everything else
(decode tokens, verified drafts, outputs recomputed after a preemption) the float32 kernel, so how a
token is computed depends on the token and its request alone, never on the batch. The activations
and outputs of the tiles are rounded to bfloat16 and the weights are the quantized blocks' values
rounded to bfloat16: prompt tokens' keys, values and first logits move by bfloat16's rounding.

In an MLP whose gate/up and down projections both have tiles, a prompt row's activation goes from
the gate/up tile's bfloat16 output to the down tile's bfloat16 input in one kernel pass
(`mlp_in_tiles`, `engine.kernels.silu_mul`): computed in float32 and rounded once, as the down
tile rounded it when torch computed it in float32 between them, at a third of the time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.kernels import silu_mul

ROW_TILE = 128
"""The reference tile: the weight is prepacked for it, and a weight uses another size only where it gives these bits."""
TILE_SIZES = (48, 64, 96, ROW_TILE, 256)
"""Tile sizes a weight may take (`PromptTiles.tile_sizes`)."""
PROBE_ROWS = 384
"""Rows of the random probe that checks a size's bits against `ROW_TILE`'s."""
TILES_MEMORY_FRACTION = 0.25
"""By default the tiles are made only while their bfloat16 weights take at most this share of the host's available memory."""


def tile_plan(num_rows: int, sizes: tuple[int, ...]) -> list[int]:
    """The sizes of consecutive tiles that cover ``num_rows`` rows (``sizes`` ascending): the largest
    while more rows remain than it holds, then the smallest that holds the rest."""
    plan, remaining = [], num_rows
    while remaining > sizes[-1]:
        plan.append(sizes[-1])
        remaining -= sizes[-1]
    if remaining:
        plan.append(next(size for size in sizes if size >= remaining))
    return plan


def cpu_has_amx() -> bool:
    """Whether this CPU has AMX bfloat16 tiles and torch has oneDNN's prepacked linear."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in flags and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@dataclass(frozen=True)
class RowGroup:
    """Rows of a step's flat batch computed alike: in bfloat16 tiles (``tiles``) or by the float32 kernel.

    rows: a slice where they are one run (a step's decode tokens come first, its prompt chunks after
    them: a view instead of a gather, 4-5x cheaper at 500 rows), else [R] int64 row indices.
    """

    tiles: bool
    rows: slice | torch.Tensor


@dataclass(frozen=True)
class MatmulRows:
    """How a step's linear layers compute each row: its rows split into `RowGroup`s."""

    groups: tuple[RowGroup, ...]

    @staticmethod
    def of(takes_tiles: torch.Tensor) -> MatmulRows | None:
        """From takes_tiles: [T] bool (host), whether each row takes the tiles; None if no row does."""
        if not takes_tiles.any():
            return None
        groups = []
        for tiles in (False, True):
            indices = (takes_tiles == tiles).nonzero().flatten()
            if len(indices):
                first, end = int(indices[0]), int(indices[-1]) + 1
                groups.append(RowGroup(tiles, slice(first, end) if end - first == len(indices) else indices))
        return MatmulRows(tuple(groups))

    def compute(self, x: torch.Tensor, out_features: int, compute: Callable[[torch.Tensor, bool, torch.Tensor | None], torch.Tensor]) -> torch.Tensor:
        """x: [T, in] -> [T, out_features], each group's rows by ``compute(rows_x, tiles, out)``, which
        returns its result, written into ``out`` where it is given (a view of the whole result)."""
        if len(self.groups) == 1:  # every row alike: no split
            return compute(x, self.groups[0].tiles, None)
        out = x.new_empty(x.shape[0], out_features)
        for group in self.groups:
            if group.tiles and isinstance(group.rows, slice):
                compute(x[group.rows], True, out[group.rows])
            else:
                out[group.rows] = compute(x[group.rows], group.tiles, None)
        return out


class PromptTiles:
    """``x @ W.T`` in bfloat16 tiles, W prepacked once, of the sizes that give `ROW_TILE`'s bits (see the module)."""

    def __init__(self, weight: torch.Tensor, tile_sizes: tuple[int, ...] | None = None) -> None:
        """weight: [N, K] float32; tile_sizes: ascending (default `tile_sizes_for` its shape)."""
        self.out_features, self.in_features = weight.shape
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.to(torch.bfloat16), ROW_TILE)
        self.tile_sizes = tile_sizes or tile_sizes_for(self.out_features, self.in_features)

    def matmul(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """x: [T, K] float32 -> [T, N] float32 (computed in bfloat16 tiles: `tile_plan`), written into
        ``out`` if given (a view of a larger result)."""
        return self.in_tiles(x, tile_plan(x.shape[0], self.tile_sizes), out)

    def in_tiles(self, x: torch.Tensor, plan: list[int], out: torch.Tensor | None = None) -> torch.Tensor:
        """x @ W.T, one oneDNN call per tile of ``plan`` (sizes covering x's rows; the last padded with zeros)."""
        return self.from_padded(padded(x, sum(plan)), plan, x.shape[0], out)

    def from_padded(self, tiles_in: torch.Tensor, plan: list[int], num_rows: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """tiles_in: [>= sum(plan), K] bfloat16, its first ``num_rows`` rows the input -> [num_rows, N]
        float32 (written into ``out`` if given), one oneDNN call per tile of ``plan``."""
        out = tiles_in.new_empty(num_rows, self.out_features, dtype=torch.float32) if out is None else out
        for start, tile_out in self.tile_outputs(tiles_in, plan):
            out[start : start + len(tile_out)] = tile_out[: num_rows - start]
        return out

    def tile_outputs(self, tiles_in: torch.Tensor, plan: list[int]) -> Iterator[tuple[int, torch.Tensor]]:
        """tiles_in: [sum(plan), K] bfloat16 -> (first row, [size, N] bfloat16) for each tile of ``plan``, in order."""
        start = 0
        for size in plan:
            yield start, torch.ops.mkldnn._linear_pointwise(tiles_in[start : start + size], self.packed, None, "none", [], "")
            start += size


def padded(x: torch.Tensor, num_rows: int) -> torch.Tensor:
    """x: [R, K] -> [num_rows, K] bfloat16 (num_rows >= R): x's rows rounded, then zeros."""
    tiles_in = x.new_empty(num_rows, x.shape[1], dtype=torch.bfloat16)
    tiles_in[: x.shape[0]].copy_(x)
    tiles_in[x.shape[0] :].zero_()
    return tiles_in


def can_mlp_in_tiles(intermediate_size: int) -> bool:
    """Whether `mlp_in_tiles` takes an MLP of ``intermediate_size``: the activation kernel built, its columns whole vectors."""
    return intermediate_size % silu_mul.LANES == 0 and silu_mul.load() is not None


def mlp_in_tiles(gate_up: PromptTiles, down: PromptTiles, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x: [R, hidden] float32 -> down(silu(gate) * up) [R, hidden] float32 (into ``out`` if given),
    gate_up: [2I, hidden] tiles (gate rows, then up), down: [hidden, I]. The activation goes from the
    gate/up tiles to the down tiles in bfloat16, in one kernel pass (`engine.kernels.silu_mul`): each
    value computed in float32 and rounded once, as the down tiles would round it."""
    num_rows = x.shape[0]
    gate_up_plan, down_plan = tile_plan(num_rows, gate_up.tile_sizes), tile_plan(num_rows, down.tile_sizes)
    activations = x.new_empty(max(sum(gate_up_plan), sum(down_plan)), down.in_features, dtype=torch.bfloat16)
    for start, tile_out in gate_up.tile_outputs(padded(x, sum(gate_up_plan)), gate_up_plan):
        silu_mul.silu_mul_bf16(tile_out, activations[start : start + len(tile_out)])
    activations[sum(gate_up_plan) :].zero_()
    return down.from_padded(activations, down_plan, num_rows, out)


@functools.cache
def tile_sizes_for(out_features: int, in_features: int) -> tuple[int, ...]:
    """Those of `TILE_SIZES` whose tiles give a [out_features, in_features] weight's outputs bit for bit
    as `ROW_TILE`'s do. oneDNN picks its kernel by the shapes, not the values, so one random weight and
    probe of each shape tell (0.11 s for the default model's four shapes, measured here)."""
    generator = torch.Generator().manual_seed(0)
    probe_tiles = PromptTiles(torch.randn(out_features, in_features, generator=generator), tile_sizes=(ROW_TILE,))
    probe = torch.randn(PROBE_ROWS, in_features, generator=generator)
    reference = probe_tiles.in_tiles(probe, [ROW_TILE] * -(-PROBE_ROWS // ROW_TILE))
    return tuple(size for size in TILE_SIZES if torch.equal(probe_tiles.in_tiles(probe, [size] * -(-PROBE_ROWS // size)), reference))
