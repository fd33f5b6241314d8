"""Linear layers whose weights are prepacked once for oneDNN, for bfloat16 on the CPU.

``F.linear`` on a plain bfloat16 weight lets oneDNN reorder the weight into its blocked layout on
every call; the reorder costs as much as the multiply itself. `PackedLinear` does it once at load:
a 576x1536 projection ran about 2x faster at every batch size from 1 to 256 tokens, with the same
results (`tests/engine/test_packed_linear.py`), and the default model's step 10-20% faster.
"""

from __future__ import annotations

import torch
from torch import nn

PACKING_BATCH_HINT = 256
"""Rows oneDNN picks its weight layout for; a layout for 64 or more rows serves 1 to 512 rows alike."""


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether this torch build has oneDNN's prepacked linear, and the model runs it (bfloat16 on the CPU)."""
    return device.type == "cpu" and dtype == torch.bfloat16 and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedLinear(nn.Module):
    """``F.linear(x, weight, bias)`` on a weight reordered once into oneDNN's blocked layout."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.out_features = linear.out_features
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), PACKING_BATCH_HINT)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, in] bfloat16 -> [T, out]."""
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


def pack_linears(module: nn.Module) -> None:
    """Replace every ``nn.Linear`` under ``module`` by a `PackedLinear` of the same weight."""
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, PackedLinear(child))
        else:
            pack_linears(child)
