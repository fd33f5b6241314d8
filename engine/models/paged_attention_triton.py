"""Triton paged-attention decode kernel: one query token per sequence, read through its block table.

The CUDA path for decode groups (`engine.models.llama.Attention`); the torch gather path is
its reference. Import this module only when the kernel is needed: ``TRITON_INTERPRET`` is
read when the kernel is decorated, so tests set it before the first import.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def paged_decode_kernel(
    q_ptr, key_ptr, value_ptr, tables_ptr, seq_lens_ptr, out_ptr, scale,
    stride_q_seq, stride_q_head, stride_cache_block, stride_cache_pos, stride_cache_head, stride_table, stride_out_seq, stride_out_head,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
):  # fmt: skip
    """Program (sequence, kv head): the GROUP query heads sharing the kv head attend the
    sequence's first ``seq_lens[sequence]`` positions, block by block, with an online softmax."""
    sequence = tl.program_id(0)
    kv_head = tl.program_id(1)
    group = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM)
    slots = tl.arange(0, BLOCK_SIZE)
    in_group = group < GROUP
    heads = kv_head * GROUP + group
    q = tl.load(q_ptr + sequence * stride_q_seq + heads[:, None] * stride_q_head + dims[None, :], mask=in_group[:, None], other=0.0)
    q = q.to(tl.float32) * scale
    seq_len = tl.load(seq_lens_ptr + sequence)
    running_max = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
    for index in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):
        block = tl.load(tables_ptr + sequence * stride_table + index)
        valid = index * BLOCK_SIZE + slots < seq_len
        offsets = block * stride_cache_block + slots[:, None] * stride_cache_pos + kv_head * stride_cache_head + dims[None, :]
        keys = tl.load(key_ptr + offsets, mask=valid[:, None], other=0.0).to(tl.float32)  # [BLOCK_SIZE, HEAD_DIM]
        values = tl.load(value_ptr + offsets, mask=valid[:, None], other=0.0).to(tl.float32)
        scores = tl.sum(q[:, None, :] * keys[None, :, :], axis=2)  # [GROUP_PAD, BLOCK_SIZE]
        scores = tl.where(valid[None, :], scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        weights = tl.exp(scores - new_max[:, None])
        rescale = tl.exp(running_max - new_max)
        running_sum = running_sum * rescale + tl.sum(weights, axis=1)
        acc = acc * rescale[:, None] + tl.sum(weights[:, :, None] * values[None, :, :], axis=1)
        running_max = new_max
    out = acc / running_sum[:, None]
    out_offsets = sequence * stride_out_seq + heads[:, None] * stride_out_head + dims[None, :]
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=in_group[:, None])


def paged_decode_attention(
    q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor
) -> torch.Tensor:
    """q: [B, H, D] (one query per sequence), caches: [num_blocks, block_size, KVH, D], block_tables: [B, N]
    int64, seq_lens: [B] int64 (>= 1, positions attended, <= N * block_size) -> [B, H, D]."""
    batch, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    q, block_tables = q.contiguous(), block_tables.contiguous()
    out = torch.empty_like(q)
    paged_decode_kernel[(batch, num_kv_heads)](
        q, key_cache, value_cache, block_tables, seq_lens.contiguous(), out, head_dim**-0.5,
        q.stride(0), q.stride(1), key_cache.stride(0), key_cache.stride(1), key_cache.stride(2), block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=group, GROUP_PAD=triton.next_power_of_2(group), BLOCK_SIZE=block_size, HEAD_DIM=head_dim,
    )  # fmt: skip
    return out
