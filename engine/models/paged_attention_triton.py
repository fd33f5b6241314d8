"""Triton paged-attention decode kernel: one query token per sequence, read through its block table.

The CUDA path for decode groups (`engine.models.llama.Attention`); the torch gather path is
its reference. Each program takes one sequence's kv head (its GROUP query heads together, as the
rows of two matrix products) over one partition of the sequence's positions, a tile of
``TILE_POSITIONS`` positions (several cache blocks) per loop iteration with an online softmax.
When the batch's sequences and kv heads alone would leave the device's multiprocessors idle (a
small batch), each sequence's positions are split into partitions attended side by side, and a
second kernel merges the partitions' softmax states (as flash-decoding does).

Numerics: 16-bit caches multiply the query and keys on the tensor cores (16-bit products are
exact in float32 accumulation) and the softmax weights by the values as two 16-bit parts (high
and low, about 16 bits of the float32 weight); float32 caches use float32 products throughout
(no TF32). Import this module only when the kernel is needed: ``TRITON_INTERPRET`` is read when
the kernel is decorated, so tests set it before the first import.
"""

from __future__ import annotations

from functools import cache

import torch
import triton
import triton.language as tl

TILE_POSITIONS = {2: 64, 4: 32}
"""Positions a program attends per loop iteration, by the cache's bytes per element."""

MIN_GROUP_ROWS = 16
"""A matrix product's smallest side on the GPU: the GROUP query heads are padded to it."""

MAX_SPLITS = 64
"""Partitions a sequence's positions are split into at most (the merge kernel's width: one compiled
kernel for every split count, where each count compiling its own took a device check past its limit)."""

PROGRAMS_PER_SM = 2
"""Programs wanted per streaming multiprocessor before a sequence's positions are split."""

INTERPRETER_SMS = 132
"""The multiprocessors the interpreter (on the CPU) stands in for: an H100's or H200's."""


@triton.jit
def _scores(q, keys, BFLOAT16: tl.constexpr):
    """q [G, D] . keys [P, D] -> [G, P] float32."""
    if BFLOAT16:
        return tl.dot(q, tl.trans(keys))
    return tl.dot(q.to(tl.float32), tl.trans(keys).to(tl.float32), input_precision="ieee")


@triton.jit
def _weighted_values(weights, values, BFLOAT16: tl.constexpr):
    """weights [G, P] float32 . values [P, D] -> [G, D] float32."""
    if BFLOAT16:
        high = weights.to(tl.bfloat16)
        low = (weights - high.to(tl.float32)).to(tl.bfloat16)
        return tl.dot(high, values) + tl.dot(low, values)
    return tl.dot(weights, values.to(tl.float32), input_precision="ieee")


@triton.jit
def paged_decode_kernel(
    q_ptr, key_ptr, value_ptr, tables_ptr, seq_lens_ptr, out_ptr, part_max_ptr, part_sum_ptr, part_out_ptr, scale,
    stride_q_seq, stride_q_head, stride_cache_block, stride_cache_pos, stride_cache_head, stride_table, stride_out_seq, stride_out_head,
    num_splits, partition_len,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, TILE: tl.constexpr,
    BFLOAT16: tl.constexpr,
):  # fmt: skip
    """Program (sequence, kv head, partition): the GROUP query heads sharing the kv head attend the
    partition's positions (below ``seq_lens[sequence]``), a tile at a time, with an online softmax.
    One partition: the output. Several: the partition's maximum, sum and unnormalised output [H, D]
    into the part buffers ([B, H, num_splits] and [B, H, num_splits, D], contiguous) for `merge_kernel`."""
    sequence = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    group = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM)
    in_group = group < GROUP
    heads = kv_head * GROUP + group
    q = tl.load(q_ptr + sequence * stride_q_seq + heads[:, None] * stride_q_head + dims[None, :], mask=in_group[:, None], other=0.0)
    seq_len = tl.load(seq_lens_ptr + sequence).to(tl.int32)
    start = split * partition_len
    end = tl.minimum(seq_len, start + partition_len)
    running_max = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
    for tile_start in range(start, end, TILE):
        positions = tile_start + tl.arange(0, TILE)
        valid = positions < end
        blocks = tl.load(tables_ptr + sequence * stride_table + positions // BLOCK_SIZE, mask=valid, other=0)
        offsets = blocks[:, None] * stride_cache_block + (positions % BLOCK_SIZE)[:, None] * stride_cache_pos + kv_head * stride_cache_head + dims[None, :]
        keys = tl.load(key_ptr + offsets, mask=valid[:, None], other=0.0)  # [TILE, HEAD_DIM]
        scores = tl.where(valid[None, :], _scores(q, keys, BFLOAT16) * scale, float("-inf"))  # [GROUP_PAD, TILE]
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        weights = tl.exp(scores - new_max[:, None])
        rescale = tl.exp(running_max - new_max)
        running_sum = running_sum * rescale + tl.sum(weights, axis=1)
        values = tl.load(value_ptr + offsets, mask=valid[:, None], other=0.0)
        acc = acc * rescale[:, None] + _weighted_values(weights, values, BFLOAT16)
        running_max = new_max
    if num_splits == 1:
        out_offsets = sequence * stride_out_seq + heads[:, None] * stride_out_head + dims[None, :]
        tl.store(out_ptr + out_offsets, (acc / running_sum[:, None]).to(out_ptr.dtype.element_ty), mask=in_group[:, None])
    else:
        parts = (sequence * tl.num_programs(1) * GROUP + heads) * num_splits + split  # [GROUP_PAD]
        tl.store(part_max_ptr + parts, running_max, mask=in_group)
        tl.store(part_sum_ptr + parts, running_sum, mask=in_group)
        tl.store(part_out_ptr + parts[:, None] * HEAD_DIM + dims[None, :], acc, mask=in_group[:, None])


@triton.jit
def merge_kernel(
    part_max_ptr, part_sum_ptr, part_out_ptr, out_ptr, stride_out_seq, stride_out_head, num_splits, MAX_SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr
):
    """Program (sequence, head): the partitions' softmax states combined into the output. A partition
    past the sequence's end has maximum -inf and sum 0, and weighs nothing."""
    sequence = tl.program_id(0)
    head = tl.program_id(1)
    dims = tl.arange(0, HEAD_DIM)
    splits = tl.arange(0, MAX_SPLITS)
    present = splits < num_splits
    parts = (sequence * tl.num_programs(1) + head) * num_splits + splits
    maxima = tl.load(part_max_ptr + parts, mask=present, other=float("-inf"))
    weights = tl.exp(maxima - tl.max(maxima, axis=0))  # [MAX_SPLITS]
    total = tl.sum(weights * tl.load(part_sum_ptr + parts, mask=present, other=0.0), axis=0)
    outputs = tl.load(part_out_ptr + parts[:, None] * HEAD_DIM + dims[None, :], mask=present[:, None], other=0.0)  # [MAX_SPLITS, HEAD_DIM]
    out = tl.sum(weights[:, None] * outputs, axis=0) / total
    tl.store(out_ptr + sequence * stride_out_seq + head * stride_out_head + dims, out.to(out_ptr.dtype.element_ty))


def num_splits(batch: int, num_kv_heads: int, tiles: int, programs_wanted: int) -> int:
    """Partitions per sequence: a power of two, the most that keeps ``batch * num_kv_heads * splits``
    within ``programs_wanted`` (1 when the batch alone fills the device), and at most ``tiles``
    (a sequence's longest span in tiles) and `MAX_SPLITS`."""
    splits = 1
    while splits * 2 <= min(tiles, MAX_SPLITS) and batch * num_kv_heads * splits * 2 <= programs_wanted:
        splits *= 2
    return splits


@cache
def programs_wanted(device: torch.device) -> int:
    """Programs that fill ``device`` (the interpreter's: an H100-sized GPU)."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else INTERPRETER_SMS
    return PROGRAMS_PER_SM * sms


def paged_decode_attention(
    q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor
) -> torch.Tensor:
    """q: [B, H, D] (one query per sequence; each head's values contiguous), caches: [num_blocks, block_size, KVH, D], block_tables: [B, N]
    int64, seq_lens: [B] int64 (>= 1, positions attended, <= N * block_size) -> [B, H, D].

    The partitioning depends only on the shapes (N * block_size bounds a sequence's length), so a
    captured CUDA graph stays valid for any ``seq_lens`` its table covers."""
    batch, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    assert q.dtype == key_cache.dtype, "the query and the cache share a dtype"
    group = num_heads // num_kv_heads
    tile = TILE_POSITIONS[key_cache.element_size()]
    splits = num_splits(batch, num_kv_heads, triton.cdiv(block_tables.shape[1] * block_size, tile), programs_wanted(q.device))
    partition_len = triton.cdiv(triton.cdiv(block_tables.shape[1] * block_size, splits), tile) * tile
    q = q if q.stride(2) == 1 else q.contiguous()  # rows any stride apart: column views of a merged projection
    block_tables = block_tables.contiguous()
    out = q.new_empty(batch, num_heads, head_dim)
    part_max = part_sum = part_out = out  # unread with one partition
    if splits > 1:
        part_max = torch.empty(batch, num_heads, splits, dtype=torch.float32, device=q.device)
        part_sum = torch.empty_like(part_max)
        part_out = torch.empty(batch, num_heads, splits, head_dim, dtype=torch.float32, device=q.device)
    paged_decode_kernel[(batch, num_kv_heads, splits)](
        q, key_cache, value_cache, block_tables, seq_lens.contiguous(), out, part_max, part_sum, part_out, head_dim**-0.5,
        q.stride(0), q.stride(1), key_cache.stride(0), key_cache.stride(1), key_cache.stride(2), block_tables.stride(0),
        out.stride(0), out.stride(1), splits, partition_len,
        GROUP=group, GROUP_PAD=max(MIN_GROUP_ROWS, triton.next_power_of_2(group)), BLOCK_SIZE=block_size, HEAD_DIM=head_dim,
        TILE=tile, BFLOAT16=key_cache.dtype == torch.bfloat16,
    )  # fmt: skip
    if splits > 1:
        merge_kernel[(batch, num_heads)](part_max, part_sum, part_out, out, out.stride(0), out.stride(1), splits, MAX_SPLITS=MAX_SPLITS, HEAD_DIM=head_dim)
    return out
