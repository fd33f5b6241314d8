"""The CPU paged-attention decode kernel (``paged_attention.cpp``), built once and loaded.

Decode groups of a float32 CPU engine (one query token per sequence) attend through it instead of
gathering every sequence's blocks into a padded tensor for SDPA (`engine.models.llama`): it reads
the paged cache in place through the block table, once per (sequence, kv head), and each
sequence's softmax runs over exactly its own positions in one fixed order, so a sequence's output
does not depend on the batch beside it.

``python -m engine.kernels.paged_attention`` builds it (``make install`` does; see
`engine.kernels.build`). ``load()`` returns None, and says why in the log, where it cannot be
built: decode groups then keep the gather and SDPA path.
"""

from __future__ import annotations

import functools
import logging
from types import ModuleType

import torch

from engine.kernels.build import load_kernel


@functools.cache
def load() -> ModuleType | None:
    """The compiled module (``paged_decode_attention``), or None if it cannot be built here."""
    return load_kernel("paged_attention", "decode attention gathers the cache's blocks for SDPA")


def can_decode(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether decode groups of a model on ``device`` in ``dtype`` can attend through the kernel:
    float32 on the CPU, a head_dim the kernel takes (a multiple of 16, at most 256), the kernel built."""
    return device.type == "cpu" and dtype == torch.float32 and head_dim % 16 == 0 and head_dim <= 256 and load() is not None


def paged_decode_attention(
    q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor
) -> torch.Tensor:
    """q: [B, H, D] float32 (one query per sequence), caches: [num_blocks, block_size, KVH, D],
    block_tables: [B, N] int32 or int64, seq_lens: [B] (1 to N * block_size) -> [B, H, D], with
    SDPA's scale 1/sqrt(D). Needs the built kernel (``load()`` not None)."""
    kernel = load()
    assert kernel is not None, "the paged-attention kernel is not built here"
    return kernel.paged_decode_attention(q, key_cache, value_cache, block_tables, seq_lens, q.shape[-1] ** -0.5)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    print("paged-attention decode kernel:", "built" if load() is not None else "unavailable")
