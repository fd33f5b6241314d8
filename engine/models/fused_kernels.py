"""The fused kernels a model's layers call, one set per device type.

On the CPU they are the C++ kernels of `engine.kernels` (float32); on CUDA the Triton kernels of
`engine.models.*_triton`. Where both have a kernel it is the same function with the same arguments
(`tests/engine/test_fused_kernels.py` compares the signatures), so a layer calls
``for_device_type(x.device.type).rope_and_write_cache(...)`` without asking which; a kernel only
one device has is None on the other, where torch's operations run instead. Whether a model may
call a kernel at all (its dtype and head size, the C++ build) is the model runner's choice
(`AttentionMetadata.rope_kernel` and ``decode_kernel``). Triton is imported at the first CUDA
call, once: the CPU needs none of it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.kernels import paged_attention, rope_cache


@dataclass(frozen=True)
class FusedKernels:
    """One device type's kernels (see the module)."""

    rope_and_write_cache: Callable[..., None]
    """q, k, v, cos, sin, positions, blocks, offsets, key_cache, value_cache: q and k rotated, k and v written into the caches."""
    paged_decode_attention: Callable[..., torch.Tensor]
    """q [B, H, D], key_cache, value_cache, block_tables, seq_lens -> [B, H, D]: one query per sequence over its cache blocks."""
    add_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None
    """x, delta, weight, eps -> (x + delta, its RMS norm) in one pass."""
    silu_mul: Callable[..., torch.Tensor] | None
    """gate, up -> silu(gate) * up in one pass."""


@functools.cache
def for_device_type(device_type: str) -> FusedKernels:
    """The kernels for tensors on ``device_type`` ("cuda": Triton's; any other: the CPU's)."""
    if device_type == "cuda":
        from engine.models import activation_triton, paged_attention_triton, rms_norm_triton, rope_cache_triton

        return FusedKernels(
            rope_cache_triton.rope_and_write_cache, paged_attention_triton.paged_decode_attention, rms_norm_triton.add_rms_norm, activation_triton.silu_mul
        )
    return FusedKernels(rope_cache.rope_and_write_cache, paged_attention.paged_decode_attention, add_rms_norm=None, silu_mul=None)
