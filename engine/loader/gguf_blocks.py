"""A GGUF tensor's Q4_0, Q4_1 or Q8_0 blocks as a `QuantizedWeight`, without dequantizing them.

GGUF blocks hold 32 weights of a row: Q4_1 a float16 scale ``d`` and minimum ``m`` then 16 bytes
of nibbles (20 bytes), Q4_0 ``d`` then the nibbles (18 bytes, ``w = d * (q - 8)``), Q8_0 ``d`` then
32 int8 (34 bytes).
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.gguf_reader import ReaderTensor

from engine.models.quant_linear import BLOCK, QuantizedWeight

_BLOCK_BYTES = {GGMLQuantizationType.Q4_0: 18, GGMLQuantizationType.Q4_1: 20, GGMLQuantizationType.Q8_0: 34}


def quantized_weight(tensor: ReaderTensor) -> QuantizedWeight | None:
    """The blocks of a 2-D Q4_0/Q4_1/Q8_0 tensor (rows of whole blocks); None for any other."""
    kind = tensor.tensor_type
    if kind not in _BLOCK_BYTES or len(tensor.shape) != 2:
        return None
    raw = np.asarray(tensor.data)
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, _BLOCK_BYTES[kind])
    if blocks.shape[1] * BLOCK != int(tensor.shape[0]):  # GGUF lists the row length first
        return None
    scales = _float16(blocks[..., 0:2])
    if kind == GGMLQuantizationType.Q8_0:
        q = torch.from_numpy(np.ascontiguousarray(blocks[..., 2:]).view(np.int8).reshape(rows, -1))
        return QuantizedWeight(q, scales, None)
    if kind == GGMLQuantizationType.Q4_1:
        mins, nibbles = _float16(blocks[..., 2:4]), blocks[..., 4:]
    else:
        mins, nibbles = -8 * scales, blocks[..., 2:]
    return QuantizedWeight(torch.from_numpy(np.ascontiguousarray(nibbles).reshape(rows, -1)), scales, mins)


def _float16(pairs: np.ndarray) -> torch.Tensor:
    """[rows, blocks, 2] bytes -> [rows, blocks] float32."""
    return torch.from_numpy(np.ascontiguousarray(pairs).view(np.float16)[..., 0].astype(np.float32))
