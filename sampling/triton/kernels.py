"""Sorting-free truncation + draw kernel.

Each program handles ``BLOCK_R`` rows and loops over the vocabulary in ``BLOCK_V``
chunks; nothing is sorted. With ``w = exp(logit - max)`` in (0, 1], every upper-set
truncation keeps ``w >= t`` for a per-row threshold ``t``:

* min-p: ``t = min_p``;
* top-k: the largest ``t`` with ``count(w >= t) >= k`` (the k-th largest kept weight);
* top-p: the largest ``t`` with ``mass(w >= t) >= top_p * mass(kept)``.

Thresholds are found by bisection on the float32 bit pattern (monotone for
non-negative floats) between the current threshold and 1.0, each bound snapped to the
nearest weight after a pass, until the bounds are adjacent: the result is an exact
element value, so the kept set equals the sort-based definition (ties at
the boundary all kept). The draw is the exponential race with the same counter-based
hash as `sampling.ops.seeded_noise` (uint32 values in int64 arithmetic, bit-identical).
"""

from __future__ import annotations

import triton
import triton.language as tl

MASK32 = 0xFFFFFFFF
ONE_BITS_PLUS_ONE = 0x3F800001  # bits(1.0) + 1: the condition is false there for every row


@triton.jit
def _fmix32(x):
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & 0xFFFFFFFF
    return x ^ (x >> 16)


@triton.jit
def _weights(logits_ptr, row_off, row_mask, cols, V, row_max):
    """[BLOCK_R, BLOCK_V] weights exp(logit - max) of one vocabulary chunk, 0 outside."""
    mask = row_mask[:, None] & (cols < V)[None, :]
    x = tl.load(logits_ptr + row_off[:, None] + cols[None, :], mask=mask, other=float("-inf"))
    return tl.exp(x - row_max[:, None])


@triton.jit
def _row_max(logits_ptr, row_off, row_mask, V, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        mask = row_mask[:, None] & (cols < V)[None, :]
        x = tl.load(logits_ptr + row_off[:, None] + cols[None, :], mask=mask, other=float("-inf"))
        m = tl.maximum(m, tl.max(x, axis=1))
    return tl.where(m == float("-inf"), 0.0, m)


@triton.jit
def _count_and_mass(logits_ptr, row_off, row_mask, V, row_max, t, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):
    """Per row, over tokens with ``w >= t`` (t [BLOCK_R]): count, total weight, smallest weight; and the
    largest weight below ``t`` (0 if none)."""
    count = tl.zeros([BLOCK_R], tl.int32)
    mass = tl.zeros([BLOCK_R], tl.float32)
    smallest_in = tl.full([BLOCK_R], float("inf"), tl.float32)
    largest_out = tl.zeros([BLOCK_R], tl.float32)
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        w = _weights(logits_ptr, row_off, row_mask, cols, V, row_max)
        selected = (w >= t[:, None]) & (w > 0)
        count += tl.sum(selected.to(tl.int32), axis=1)
        mass += tl.sum(tl.where(selected, w, 0.0), axis=1)
        smallest_in = tl.minimum(smallest_in, tl.min(tl.where(selected, w, float("inf")), axis=1))
        largest_out = tl.maximum(largest_out, tl.max(tl.where(selected, 0.0, w), axis=1))
    return count, mass, smallest_in, largest_out


@triton.jit
def _bisect(logits_ptr, row_off, row_mask, V, row_max, t, count_target, mass_target,
            BY_MASS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """Largest threshold >= t (t satisfies the condition) whose kept count / mass still reaches the target.

    Invariant: the condition holds at ``lo`` and fails at ``hi`` (float32 bits). Each pass
    tests the midpoint and snaps the moving bound to the nearest weight, so it stops
    after about log2(distinct weights) passes and at most 31.
    """
    lo = t.to(tl.int32, bitcast=True)
    hi = tl.full([BLOCK_R], ONE_BITS_PLUS_ONE, tl.int32)
    while tl.max(hi - lo, axis=0) > 1:
        mid = lo + (hi - lo) // 2
        count, mass, smallest_in, largest_out = _count_and_mass(
            logits_ptr, row_off, row_mask, V, row_max, mid.to(tl.float32, bitcast=True), BLOCK_R, BLOCK_V
        )
        if BY_MASS:
            ok = mass >= mass_target
        else:
            ok = count >= count_target
        snapped_lo = tl.where(count > 0, smallest_in.to(tl.int32, bitcast=True), mid)
        lo = tl.where(ok, tl.minimum(tl.maximum(snapped_lo, mid), hi - 1), lo)
        hi = tl.where(ok, hi, tl.maximum(largest_out.to(tl.int32, bitcast=True) + 1, lo + 1))
    return lo.to(tl.float32, bitcast=True)


@triton.jit
def truncate_and_draw_kernel(
    logits_ptr, stride, top_k_ptr, top_p_ptr, min_p_ptr, key_ptr, token_ptr, processed_ptr, n_rows, V,
    HAS_MIN_P: tl.constexpr, HAS_TOP_K: tl.constexpr, HAS_TOP_P: tl.constexpr, WRITE_PROCESSED: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """logits [n, V] (temperature applied, row stride ``stride``) -> token [n] int64; with
    WRITE_PROCESSED also the kept logits (-inf elsewhere) into processed [n, V] (same strides)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_mask = rows < n_rows
    row_off = rows.to(tl.int64) * stride
    row_max = _row_max(logits_ptr, row_off, row_mask, V, BLOCK_R, BLOCK_V)
    t = tl.zeros([BLOCK_R], tl.float32)
    if HAS_MIN_P:
        t = tl.maximum(t, tl.load(min_p_ptr + rows, mask=row_mask, other=0.0))
    if HAS_TOP_K:
        k = tl.load(top_k_ptr + rows, mask=row_mask, other=0).to(tl.int32)
        t_k = _bisect(logits_ptr, row_off, row_mask, V, row_max, t, k, 0.0, False, BLOCK_R, BLOCK_V)
        t = tl.where(k > 0, t_k, t)
    if HAS_TOP_P:
        top_p = tl.load(top_p_ptr + rows, mask=row_mask, other=1.0)
        _, total, _, _ = _count_and_mass(logits_ptr, row_off, row_mask, V, row_max, t, BLOCK_R, BLOCK_V)
        t_p = _bisect(logits_ptr, row_off, row_mask, V, row_max, t, 0, top_p * total, True, BLOCK_R, BLOCK_V)
        t = tl.where(top_p < 1.0, t_p, t)
    key = tl.load(key_ptr + rows, mask=row_mask, other=0)
    best = tl.full([BLOCK_R], -1.0, tl.float32)
    best_idx = tl.zeros([BLOCK_R], tl.int64)
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        w = _weights(logits_ptr, row_off, row_mask, cols, V, row_max)
        token = cols.to(tl.int64)
        h = _fmix32(key[:, None] ^ _fmix32((token * 0x9E3779B9 + 0x632BE5AB) & 0xFFFFFFFF)[None, :])
        u = ((h >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
        keep = (w >= t[:, None]) & (w > 0)
        score = tl.where(keep, w / -tl.log(u), -1.0)
        if WRITE_PROCESSED:
            offsets = row_off[:, None] + cols[None, :]
            mask = row_mask[:, None] & (cols < V)[None, :]
            x = tl.load(logits_ptr + offsets, mask=mask, other=float("-inf"))
            tl.store(processed_ptr + offsets, tl.where(keep, x, float("-inf")), mask=mask)
        block_best = tl.max(score, axis=1)
        block_idx = tl.argmax(score, axis=1).to(tl.int64) + start
        better = block_best > best
        best = tl.where(better, block_best, best)
        best_idx = tl.where(better, block_idx, best_idx)
    tl.store(token_ptr + rows, best_idx, mask=row_mask)
