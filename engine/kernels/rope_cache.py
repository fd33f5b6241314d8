"""The CPU kernel that rotates a step's queries and keys and writes its keys and values into the
paged cache in one call (``rope_cache.cpp``), built once and loaded.

A float32 CPU engine's attention calls it in place of about twenty small torch operations a layer
(the rotary halves' slices, negation, concatenation, products and sum; the two cache writes):
at one token a step those operations cost more than the layer's attention itself. The result is
torch's bit for bit (`tests/engine/test_rope_cache.py`).

``python -m engine.kernels.rope_cache`` builds it (``make install`` does; see
`engine.kernels.build`). ``load()`` returns None, and says why in the log, where it cannot be
built: attention then rotates and writes with torch's operations.
"""

from __future__ import annotations

import functools
import logging
from types import ModuleType

import torch

from engine.kernels.build import load_kernel


@functools.cache
def load() -> ModuleType | None:
    """The compiled module (``rope_and_write_cache``), or None if it cannot be built here."""
    return load_kernel("rope_cache", "attention rotates and writes the cache with torch's operations")


def can_fuse(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether a model on ``device`` in ``dtype`` can rotate and write through the kernel: float32
    on the CPU, an even head_dim of at most 512, the kernel built."""
    return device.type == "cpu" and dtype == torch.float32 and head_dim % 2 == 0 and head_dim <= 512 and load() is not None


def rope_and_write_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    blocks: torch.Tensor,
    offsets: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
) -> None:
    """q: [T, H, D] rotated in place; k, v: [T, KVH, D]: k rotated and v written at cache slot
    (``blocks[t]``, ``offsets[t]``) of key_cache, value_cache [num_blocks, block_size, KVH, D];
    cos, sin: [P, D] tables; positions, blocks, offsets: [T] int64. Each token's heads of q, k and v contiguous
    (tokens any stride apart: column views of one merged projection), the tables and caches contiguous.
    Needs the built kernel (``load()`` not None)."""
    kernel = load()
    assert kernel is not None, "the rope-and-cache kernel is not built here"
    # The index columns may be strided views (a CUDA-graph-style step keeps them as columns of one tensor).
    kernel.rope_and_write_cache(q, k, v, cos, sin, positions.contiguous(), blocks.contiguous(), offsets.contiguous(), key_cache, value_cache)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    print("rope-and-cache kernel:", "built" if load() is not None else "unavailable")
