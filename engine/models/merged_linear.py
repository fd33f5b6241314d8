"""Several dense linears of the same input as one matmul: a layer's q, k and v projections, its gate
and up projections (on CUDA, where each launch costs microseconds a step and a wider matrix keeps
the device busier; `engine.models.quant_linear.MergedQuantLinear` is the quantized CPU counterpart)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MergedLinear(nn.Module):
    """``forward`` returns each merged linear's output, column views of the one result."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, split_sizes: list[int]) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.split_sizes = split_sizes

    @classmethod
    def of(cls, linears: list[nn.Module]) -> MergedLinear | None:
        """The linears as one, or None unless all are ``nn.Linear`` of one dtype whose biases are all present or all absent."""
        if not all(type(linear) is nn.Linear for linear in linears) or len({linear.bias is None for linear in linears}) != 1:
            return None
        if len({linear.weight.dtype for linear in linears}) != 1:
            return None
        weight = torch.cat([linear.weight.detach() for linear in linears])
        bias = None if linears[0].bias is None else torch.cat([linear.bias.detach() for linear in linears])
        return cls(weight, bias, [linear.out_features for linear in linears])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x: [T, in] -> one [T, out_i] view per merged linear."""
        return F.linear(x, self.weight, self.bias).split(self.split_sizes, dim=-1)
