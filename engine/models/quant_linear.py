"""Linear layers that keep a GGUF's 4-bit or 8-bit blocks and multiply through them.

A Q4_0/Q4_1 weight [N, K] is kept as its nibbles ``q`` [N, K/2] uint8 (block b of row n in bytes
16b..16b+15: weight 32b+j in the low nibble of byte j, 32b+16+j in the high one) with a scale and
a minimum per block of 32, ``scales``/``mins`` [N, K/32] float32: ``w = scale * q + min`` (Q4_0 has
``min = -8 * scale``); a Q8_0 weight as ``q`` [N, K] int8 and ``scales``: ``w = scale * q``. These
are exactly the float32 values gguf's ``dequantize`` gives (``scale * q`` is exact in float32), so
the kernel (`engine.kernels.quant_matmul`) computes the dequantized float32 matmul in another
summation order, reading 0.75 (4-bit) or 1.125 (8-bit) bytes a weight instead of 4. Its order
per output does not depend on the batch: a row's result is the same alone and among others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from engine.kernels import quant_matmul
from engine.models.prompt_tiles import MatmulRows, PromptTiles

BLOCK = 32


@dataclass(frozen=True)
class QuantizedWeight:
    """A [N, K] weight as blocks: ``q`` [N, K/2] uint8 (4-bit) or [N, K] int8 (8-bit), ``scales`` and ``mins`` (4-bit only) [N, K/32] float32."""

    q: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape[0], self.scales.shape[1] * BLOCK

    def rows(self, start: int, end: int) -> QuantizedWeight:
        """Rows ``start:end`` of the weight (views)."""
        return QuantizedWeight(self.q[start:end], self.scales[start:end], None if self.mins is None else self.mins[start:end])

    def permute_rows(self, permute) -> QuantizedWeight:  # noqa: ANN001 - a function of a [N, ...] tensor
        """The weight with its rows reordered by ``permute`` (as the loader reorders q/k rows)."""
        return QuantizedWeight(*(None if t is None else permute(t).contiguous() for t in (self.q, self.scales, self.mins)))

    @staticmethod
    def stacked(weights: list[QuantizedWeight]) -> QuantizedWeight | None:
        """The weights' rows one after another as one weight [sum N, K]; None where their formats or K differ."""
        first = weights[0]
        if any(w.shape[1] != first.shape[1] or w.q.dtype != first.q.dtype or (w.mins is None) != (first.mins is None) for w in weights):
            return None
        mins = None if first.mins is None else torch.cat([w.mins for w in weights])
        return QuantizedWeight(torch.cat([w.q for w in weights]), torch.cat([w.scales for w in weights]), mins)

    def dequantize(self) -> torch.Tensor:
        """[N, K] float32, as gguf's ``dequantize`` gives it."""
        n, k = self.shape
        if self.mins is None:
            values = self.q.float().view(n, k // BLOCK, BLOCK) * self.scales[..., None]
        else:
            low, high = (self.q & 15).view(n, k // BLOCK, BLOCK // 2), (self.q >> 4).view(n, k // BLOCK, BLOCK // 2)
            values = torch.cat([low, high], dim=-1).float() * self.scales[..., None] + self.mins[..., None]
        return values.reshape(n, k)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, K] float32 -> x @ W.T [T, N] float32."""
        kernel = quant_matmul.load()
        return self._on_blocks(kernel.q8_matmul, kernel.q4_matmul, x)

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, K] float32 -> [T] int64, ``self.matmul(x).max(-1).indices`` (the first maximum) in one
        kernel call that never writes the [T, N] result (an output head's logits: N is the vocabulary)."""
        kernel = quant_matmul.load()
        return self._on_blocks(kernel.q8_argmax, kernel.q4_argmax, x)

    def _on_blocks(self, q8_operation: Callable[..., torch.Tensor], q4_operation: Callable[..., torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """The 8-bit kernel function (x, q, scales) or the 4-bit one (x, q, scales, mins), whichever format this weight has, on x made contiguous."""
        if self.mins is None:
            return q8_operation(x.contiguous(), self.q, self.scales)
        return q4_operation(x.contiguous(), self.q, self.scales, self.mins)


def can_compute_quantized(device: torch.device, dtype: torch.dtype, weights: dict[str, QuantizedWeight]) -> bool:
    """Whether the model can keep ``weights`` quantized: on the CPU in float32, where the kernel builds."""
    return bool(weights) and device.type == "cpu" and dtype == torch.float32 and quant_matmul.load() is not None


class QuantLinear(nn.Module):
    """``F.linear(x, W, bias)`` for a `QuantizedWeight` W; with `prompt_tiles`, a step's prompt rows in bfloat16 tiles."""

    def __init__(self, weight: QuantizedWeight, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight_blocks = weight
        self.out_features, self.in_features = weight.shape
        self.bias = None if bias is None else bias.detach()
        self.prompt_tiles: PromptTiles | None = None
        """W in bfloat16 for the rows `MatmulRows` names prompt rows (`add_prompt_tiles`)."""

    def forward(self, x: torch.Tensor, rows: MatmulRows | None = None) -> torch.Tensor:
        """x: [T, in] float32 -> [T, out]; ``rows``: which rows take the bfloat16 tiles, if the layer has them."""
        if rows is None or self.prompt_tiles is None:
            out = self.weight_blocks.matmul(x)
        else:
            out = rows.compute(x, self.out_features, self._matmul)
        return out if self.bias is None else out + self.bias

    def _matmul(self, x: torch.Tensor, tiles: bool, out: torch.Tensor | None = None) -> torch.Tensor:
        """x @ W.T in bfloat16 tiles (``tiles``), or by the float32 kernel."""
        if not tiles:
            return self.weight_blocks.matmul(x)
        assert self.prompt_tiles is not None
        return self.prompt_tiles.matmul(x, out)


class MergedQuantLinear(QuantLinear):
    """Several `QuantLinear`s of the same input as one matmul (a layer's q, k and v projections; its
    gate and up projections): ``forward`` returns each one's output, column views of the one result.

    The kernel sums every output element over its own weight row in one fixed order, whatever the
    other rows, so each output is bit for bit its own linear's: one call instead of several, at one
    token a step each call's fixed cost (a parallel region, the output, the dispatch) being a large
    part of a small projection's time."""

    def __init__(self, weight: QuantizedWeight, split_sizes: list[int], bias: torch.Tensor | None) -> None:
        super().__init__(weight, bias)
        self.split_sizes = split_sizes

    def forward(self, x: torch.Tensor, rows: MatmulRows | None = None) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        """x: [T, in] float32 -> one [T, out_i] view per merged linear."""
        return super().forward(x, rows).split(self.split_sizes, dim=-1)


def merged(linears: list[nn.Module]) -> MergedQuantLinear | None:
    """The linears as one `MergedQuantLinear`, or None unless all are `QuantLinear`s of one format whose
    biases are all present or all absent."""
    if not all(isinstance(linear, QuantLinear) for linear in linears) or len({linear.bias is None for linear in linears}) != 1:
        return None
    weight = QuantizedWeight.stacked([linear.weight_blocks for linear in linears])
    if weight is None:
        return None
    bias = None if linears[0].bias is None else torch.cat([linear.bias for linear in linears])
    return MergedQuantLinear(weight, [linear.out_features for linear in linears], bias)


def quantize_linears(model: nn.Module, weights: dict[str, QuantizedWeight]) -> list[str]:
    """Replace each ``nn.Linear`` of ``model`` whose weight (``<module>.weight``) ``weights`` holds
    by a `QuantLinear` of it (its float32 weight freed); returns the names replaced."""
    replaced = []
    for name, module in list(model.named_modules()):
        weight = weights.get(f"{name}.weight")
        if weight is None or not isinstance(module, nn.Linear) or weight.shape != tuple(module.weight.shape) or weight.shape[0] % 4:
            continue
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, QuantLinear(weight, module.bias))
        replaced.append(name)
    return replaced


def prompt_tiles_bytes(model: nn.Module) -> int:
    """What `add_prompt_tiles` would add: every `QuantLinear`'s weight in bfloat16."""
    return sum(2 * m.out_features * m.in_features for m in model.modules() if isinstance(m, QuantLinear))


def add_prompt_tiles(model: nn.Module) -> int:
    """Give every `QuantLinear` under ``model`` its weight in bfloat16 tiles (`engine.models.prompt_tiles`); returns how many."""
    linears = [module for module in model.modules() if isinstance(module, QuantLinear)]
    for linear in linears:
        linear.prompt_tiles = PromptTiles(linear.weight_blocks.dequantize())
    return len(linears)
