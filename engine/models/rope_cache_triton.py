"""Triton rope-and-cache kernel: a step's queries and keys rotated and its keys and values written
into the paged cache in one launch a layer; the CUDA counterpart of `engine.kernels.rope_cache`
(C++, on the CPU), with its contract.

On CUDA, torch's path (`engine.models.rope.RotaryEmbedding` and two indexed cache writes) is about
a dozen launches a layer (the tables' gathers, the halves' concatenation, products, sum, dtype
conversions, the writes): at batch 1 of a 30-layer model that is some 300 kernels of a step whose
every kernel costs microseconds. The result is torch's bit for bit: the same float32 products and
sums, each rounded, and the kernel is launched with floating-point contraction (FMA) off.
Import this module only when the kernel is needed: ``TRITON_INTERPRET`` is read when the kernel is
decorated, so tests set it before the first import.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(source, destination, num_heads, cos_lo, cos_hi, sin_lo, sin_hi, HEADS_PAD: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr):
    """``num_heads`` heads of 2 * HALF values at ``source`` (contiguous) rotated into ``destination``:
    low half ``lo * cos - hi * sin``, high half ``hi * cos + lo * sin`` (torch's ``x * cos + rotate_half(x) * sin``)."""
    heads = tl.arange(0, HEADS_PAD)[:, None]
    dims = tl.arange(0, HALF_PAD)[None, :]
    mask = (heads < num_heads) & (dims < HALF)
    low = heads * (2 * HALF) + dims
    x_lo = tl.load(source + low, mask=mask).to(tl.float32)
    x_hi = tl.load(source + low + HALF, mask=mask).to(tl.float32)
    tl.store(destination + low, (x_lo * cos_lo - x_hi * sin_lo).to(destination.dtype.element_ty), mask=mask)
    tl.store(destination + low + HALF, (x_hi * cos_hi + x_lo * sin_hi).to(destination.dtype.element_ty), mask=mask)


@triton.jit
def rope_cache_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, positions_ptr, blocks_ptr, offsets_ptr, key_cache_ptr, value_cache_ptr,
    stride_q_token, stride_k_token, stride_v_token, stride_table, stride_cache_block, stride_cache_pos, num_heads, num_kv_heads,
    HEADS_PAD: tl.constexpr, KV_HEADS_PAD: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
):  # fmt: skip
    """Program t: token t's query heads rotated in place, its key heads rotated into cache slot
    (blocks[t], offsets[t]) and its value heads copied there."""
    token = tl.program_id(0)
    position = tl.load(positions_ptr + token)
    cache_slot = tl.load(blocks_ptr + token) * stride_cache_block + tl.load(offsets_ptr + token) * stride_cache_pos
    dims = tl.arange(0, HALF_PAD)[None, :]
    in_half = dims < HALF
    table = position * stride_table + dims
    cos_lo = tl.load(cos_ptr + table, mask=in_half)
    cos_hi = tl.load(cos_ptr + table + HALF, mask=in_half)
    sin_lo = tl.load(sin_ptr + table, mask=in_half)
    sin_hi = tl.load(sin_ptr + table + HALF, mask=in_half)
    q_row = q_ptr + token * stride_q_token
    _rotate_heads(q_row, q_row, num_heads, cos_lo, cos_hi, sin_lo, sin_hi, HEADS_PAD, HALF, HALF_PAD)
    _rotate_heads(k_ptr + token * stride_k_token, key_cache_ptr + cache_slot, num_kv_heads, cos_lo, cos_hi, sin_lo, sin_hi, KV_HEADS_PAD, HALF, HALF_PAD)
    heads = tl.arange(0, KV_HEADS_PAD)[:, None]
    columns = heads * (2 * HALF) + tl.arange(0, 2 * HALF_PAD)[None, :]
    mask = (heads < num_kv_heads) & (tl.arange(0, 2 * HALF_PAD)[None, :] < 2 * HALF)
    tl.store(value_cache_ptr + cache_slot + columns, tl.load(v_ptr + token * stride_v_token + columns, mask=mask), mask=mask)


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
    """`engine.kernels.rope_cache.rope_and_write_cache` (same arguments, same contract) on CUDA tensors
    of any float dtype; the cos and sin tables float32."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    for x in (q, k, v):
        assert x.stride(2) == 1 and x.stride(1) == head_dim, "each token's heads are contiguous"
    assert key_cache.is_contiguous() and value_cache.is_contiguous() and cos.is_contiguous() and sin.is_contiguous()
    half = head_dim // 2
    rope_cache_kernel[(num_tokens,)](
        q, k, v, cos, sin, positions.contiguous(), blocks.contiguous(), offsets.contiguous(), key_cache, value_cache,
        q.stride(0), k.stride(0), v.stride(0), cos.stride(0), key_cache.stride(0), key_cache.stride(1), num_heads, num_kv_heads,
        HEADS_PAD=triton.next_power_of_2(num_heads), KV_HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        HALF=half, HALF_PAD=triton.next_power_of_2(half), enable_fp_fusion=False,
    )  # fmt: skip
