"""Sorting-free truncation + draw kernel (all six truncations of `sampling.ops.truncation`).

Each program handles ``BLOCK_R`` rows and loops over the vocabulary in ``BLOCK_V``
chunks; nothing is sorted. With ``x = logit - max`` and ``w = exp(x)`` in [0, 1] (0 where
float32 underflows), a token with a finite logit is kept when

    x >= floor  and  w >= t  and  |log Z - log w - H| <= tau  and  w <= cap

* min-p: ``t = min_p``;
* top-k: ``t`` = the largest value with ``count(kept) >= k`` (the k-th largest weight);
* top-p: ``t`` = the largest value with ``mass(kept) >= top_p * mass(kept before)``;
* typical-p: with Z, H the mass and entropy of the kept set, ``tau`` = the smallest value
  with ``mass(kept) > typical_p * Z`` (llama.cpp keeps tokens while the mass before them
  is <= typical_p, in order of the shifted score);
* top-nσ: ``floor = x_top - n * std``, with the largest kept ``x`` and the population std
  over every kept finite logit (underflowed weights included, as the torch path and
  llama.cpp take them), merged chunk by chunk in one pass (Chan et al.'s pairwise update);
* XTC: when the row's coin says so and at least two kept tokens have ``q >= threshold``,
  ``cap`` = the smallest such weight (all but the least probable removed).

Thresholds are found by bisection on the float32 bit pattern (monotone for
non-negative floats), each bound snapped to the nearest weight (or score) after a
pass, until the bounds are adjacent: the result is an exact element value, so the
kept set equals the sort-based definition, except that ties at a boundary are all
kept. The draw is the exponential race with the same counter-based hash as
`sampling.ops.seeded_noise` (uint32 values in int64 arithmetic, bit-identical).

With drafts (one per row, -1: none), the last pass also sums the kept mass and the
draft's weight and runs the race without the draft: the row accepts the draft iff its
uniform at token -2 (`sampling.ops.rejection.ACCEPT_COIN_TOKEN`) is <= p(draft), or no
other kept token has weight, and otherwise emits the race's winner.
"""

from __future__ import annotations

import triton
import triton.language as tl

from sampling.triton.noise import merge_winner

ONE_BITS_PLUS_ONE = tl.constexpr(0x3F800001)  # bits(1.0) + 1: above every weight
LOWEST = tl.constexpr(-3.4028234663852886e38)  # the lowest finite float32: a floor that keeps every finite logit
INF_BITS = tl.constexpr(0x7F800000)  # bits(+inf): at or above every score


@triton.jit
def _fmix32(x):
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & 0xFFFFFFFF
    return x ^ (x >> 16)


@triton.jit
def _uniform(key, token):
    """u in (0, 1) float32 from uint32 key [R, 1] or [R] and int64 token ids (broadcast)."""
    h = _fmix32(key ^ _fmix32((token * 0x9E3779B9 + 0x632BE5AB) & 0xFFFFFFFF))
    return ((h >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)


@triton.jit
def _shifted(logits_ptr, row_off, row_mask, cols, V, row_max):
    """(x, w), both [BLOCK_R, BLOCK_V], of one vocabulary chunk: x = logit - max (-inf outside), w = exp(x)."""
    mask = row_mask[:, None] & (cols < V)[None, :]
    x = tl.load(logits_ptr + row_off[:, None] + cols[None, :], mask=mask, other=float("-inf")) - row_max[:, None]
    return x, tl.exp(x)


@triton.jit
def _kept(x, w, t, floor, log_z, entropy, tau, cap):
    """The keep predicate for a chunk of shifted logits x and weights w [R, C]; the rest are [R]."""
    score = tl.abs(log_z[:, None] - tl.log(w) - entropy[:, None])
    return (x >= floor[:, None]) & (w >= t[:, None]) & (score <= tau[:, None]) & (w <= cap[:, None])


@triton.jit
def _kept_chunk(logits_ptr, row_off, row_mask, start, V, row_max, t, floor, log_z, entropy, tau, cap,
                BLOCK_V: tl.constexpr):  # fmt: skip
    """The vocabulary chunk at ``start``: its columns [C], shifted logits x, weights w and keep predicate [R, C]."""
    cols = start + tl.arange(0, BLOCK_V)
    x, w = _shifted(logits_ptr, row_off, row_mask, cols, V, row_max)
    return cols, x, w, _kept(x, w, t, floor, log_z, entropy, tau, cap)


@triton.jit
def _row_max(logits_ptr, row_off, row_mask, V, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        mask = row_mask[:, None] & (cols < V)[None, :]
        x = tl.load(logits_ptr + row_off[:, None] + cols[None, :], mask=mask, other=float("-inf"))
        m = tl.maximum(m, tl.max(x, axis=1))
    # A row of -inf only gets any finite max. One use of the loop's result, not tl.where's two:
    # Triton 3.6's thread-locality pass asserts on a loop-carried reduction used twice.
    return tl.maximum(m, LOWEST)


@triton.jit
def _mass(logits_ptr, row_off, row_mask, V, row_max, t, floor, log_z, entropy, tau, cap,
          BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """Per row over kept tokens: (sum w, sum w log w), both [R]."""
    mass = tl.zeros([BLOCK_R], tl.float32)
    w_log_w = tl.zeros([BLOCK_R], tl.float32)
    for start in range(0, V, BLOCK_V):
        cols, x, w, keep = _kept_chunk(logits_ptr, row_off, row_mask, start, V, row_max, t, floor, log_z, entropy,
                                       tau, cap, BLOCK_V)  # fmt: skip
        mass += tl.sum(tl.where(keep, w, 0.0), axis=1)
        w_log_w += tl.sum(tl.where(keep & (w > 0), w * tl.log(w), 0.0), axis=1)
    return mass, w_log_w


@triton.jit
def _logit_spread(logits_ptr, row_off, row_mask, V, row_max, t, floor, log_z, entropy, tau, cap,
                  BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """Per row over kept tokens (every finite logit, underflowed weights too): (largest x, population std of x), [R].

    One pass: each chunk's count, mean and sum of squared deviations are merged into the
    running ones with Chan et al.'s pairwise update (no E[x^2] - mean^2 cancellation).
    """
    count = tl.zeros([BLOCK_R], tl.float32)
    mean = tl.zeros([BLOCK_R], tl.float32)
    squares = tl.zeros([BLOCK_R], tl.float32)
    top = tl.full([BLOCK_R], float("-inf"), tl.float32)
    for start in range(0, V, BLOCK_V):
        cols, x, w, keep = _kept_chunk(logits_ptr, row_off, row_mask, start, V, row_max, t, floor, log_z, entropy,
                                       tau, cap, BLOCK_V)  # fmt: skip
        chunk_count = tl.sum(keep.to(tl.float32), axis=1)
        chunk_mean = tl.sum(tl.where(keep, x, 0.0), axis=1) / tl.maximum(chunk_count, 1.0)
        deviation = tl.where(keep, x - chunk_mean[:, None], 0.0)
        merged = tl.maximum(count + chunk_count, 1.0)
        delta = chunk_mean - mean
        mean += delta * chunk_count / merged
        squares += tl.sum(deviation * deviation, axis=1) + delta * delta * count * chunk_count / merged
        count += chunk_count
        top = tl.maximum(top, tl.max(tl.where(keep, x, float("-inf")), axis=1))
    return top, tl.sqrt(squares / tl.maximum(count, 1.0))


@triton.jit
def _probe(logits_ptr, row_off, row_mask, V, row_max, t, floor, log_z, entropy, tau, cap, probe,
           BY_SCORE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """Split the kept tokens at ``probe`` [R]: by weight (w >= probe) or by score (score <= probe).

    Returns, for the selected side: count, mass and its value nearest the boundary; for
    the other side: its value nearest the boundary (0 / inf when empty).
    """
    count = tl.zeros([BLOCK_R], tl.int32)
    mass = tl.zeros([BLOCK_R], tl.float32)
    inner = tl.full([BLOCK_R], float("inf"), tl.float32)
    outer = tl.zeros([BLOCK_R], tl.float32)
    if BY_SCORE:
        inner = tl.zeros([BLOCK_R], tl.float32)
        outer = tl.full([BLOCK_R], float("inf"), tl.float32)
    for start in range(0, V, BLOCK_V):
        cols, x, w, keep = _kept_chunk(logits_ptr, row_off, row_mask, start, V, row_max, t, floor, log_z, entropy,
                                       tau, cap, BLOCK_V)  # fmt: skip
        if BY_SCORE:
            value = tl.abs(log_z[:, None] - tl.log(w) - entropy[:, None])
            selected = keep & (value <= probe[:, None])
            inner = tl.maximum(inner, tl.max(tl.where(selected, value, 0.0), axis=1))
            outer = tl.minimum(outer, tl.min(tl.where(keep & ~selected, value, float("inf")), axis=1))
        else:
            selected = keep & (w >= probe[:, None])
            inner = tl.minimum(inner, tl.min(tl.where(selected, w, float("inf")), axis=1))
            outer = tl.maximum(outer, tl.max(tl.where(keep & ~selected, w, 0.0), axis=1))
        count += tl.sum(selected.to(tl.int32), axis=1)
        mass += tl.sum(tl.where(selected, w, 0.0), axis=1)
    return count, mass, inner, outer


@triton.jit
def _largest_weight_threshold(logits_ptr, row_off, row_mask, V, row_max, t, floor, log_z, entropy, tau, cap,
                              count_target, mass_target, BY_MASS: tl.constexpr,
                              BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """Largest weight threshold >= t whose kept count (or mass) still reaches the target.

    Invariant: the condition holds at ``lo`` and fails at ``hi`` (float32 bits); about
    log2(distinct weights) passes, at most 31.
    """
    lo = t.to(tl.int32, bitcast=True)
    hi = tl.full([BLOCK_R], ONE_BITS_PLUS_ONE, tl.int32)
    while tl.max(hi - lo, axis=0) > 1:
        mid = lo + (hi - lo) // 2
        count, mass, inner, outer = _probe(logits_ptr, row_off, row_mask, V, row_max, t, floor, log_z, entropy, tau,
                                           cap, mid.to(tl.float32, bitcast=True), False, BLOCK_R, BLOCK_V)  # fmt: skip
        if BY_MASS:
            ok = mass >= mass_target
        else:
            ok = count >= count_target
        snapped = tl.where(count > 0, inner.to(tl.int32, bitcast=True), mid)
        lo = tl.where(ok, tl.minimum(tl.maximum(snapped, mid), hi - 1), lo)
        hi = tl.where(ok, hi, tl.maximum(outer.to(tl.int32, bitcast=True) + 1, lo + 1))
    return lo.to(tl.float32, bitcast=True)


@triton.jit
def _smallest_score_threshold(logits_ptr, row_off, row_mask, V, row_max, t, floor, log_z, entropy, cap, mass_target,
                              BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """Smallest score threshold whose kept mass (score <= tau) exceeds the target.

    Invariant: the condition fails at ``lo`` and holds at ``hi`` (float32 bits, scores >= 0).
    """
    lo = tl.full([BLOCK_R], -1, tl.int32)
    hi = tl.full([BLOCK_R], INF_BITS, tl.int32)
    no_cap = tl.full([BLOCK_R], float("inf"), tl.float32)
    while tl.max(hi - lo, axis=0) > 1:
        mid = lo + (hi - lo) // 2
        count, mass, inner, outer = _probe(logits_ptr, row_off, row_mask, V, row_max, t, floor, log_z, entropy,
                                           no_cap, cap, mid.to(tl.float32, bitcast=True), True, BLOCK_R,
                                           BLOCK_V)  # fmt: skip
        ok = mass > mass_target
        hi = tl.where(ok, tl.maximum(tl.minimum(inner.to(tl.int32, bitcast=True), mid), lo + 1), hi)
        lo = tl.where(ok, lo, tl.minimum(outer.to(tl.int32, bitcast=True) - 1, hi - 1))
    return hi.to(tl.float32, bitcast=True)


@triton.jit
def truncate_and_draw_kernel(
    logits_ptr, stride, min_p_ptr, top_k_ptr, top_p_ptr, typical_p_ptr, n_sigma_ptr, xtc_threshold_ptr,
    xtc_probability_ptr, key_ptr, draft_ptr, token_ptr, accepted_ptr, processed_ptr, n_rows, V,
    HAS_MIN_P: tl.constexpr, HAS_TOP_K: tl.constexpr, HAS_TOP_P: tl.constexpr, HAS_TYPICAL_P: tl.constexpr,
    HAS_TOP_N_SIGMA: tl.constexpr, HAS_XTC: tl.constexpr, HAS_DRAFTS: tl.constexpr, WRITE_PROCESSED: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """logits [n, V] (temperature applied, row stride ``stride``) -> token [n] int64; with
    WRITE_PROCESSED also the kept logits (-inf elsewhere) into processed [n, V] (same strides).
    With HAS_DRAFTS: draft [n] int64 (-1: none) -> token (the draft or the race without it), accepted [n] int8."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_mask = rows < n_rows
    row_off = rows.to(tl.int64) * stride
    row_max = _row_max(logits_ptr, row_off, row_mask, V, BLOCK_R, BLOCK_V)
    key = tl.load(key_ptr + rows, mask=row_mask, other=0)
    t = tl.zeros([BLOCK_R], tl.float32)
    floor = tl.full([BLOCK_R], LOWEST, tl.float32)
    log_z = tl.zeros([BLOCK_R], tl.float32)
    entropy = tl.zeros([BLOCK_R], tl.float32)
    tau = tl.full([BLOCK_R], float("inf"), tl.float32)
    cap = tl.full([BLOCK_R], float("inf"), tl.float32)
    if HAS_MIN_P:
        t = tl.maximum(t, tl.load(min_p_ptr + rows, mask=row_mask, other=0.0))
    if HAS_TOP_K:
        k = tl.load(top_k_ptr + rows, mask=row_mask, other=0).to(tl.int32)
        t_k = _largest_weight_threshold(logits_ptr, row_off, row_mask, V, row_max, t, floor, log_z, entropy, tau, cap,
                                        k, 0.0, False, BLOCK_R, BLOCK_V)  # fmt: skip
        t = tl.where(k > 0, t_k, t)
    if HAS_TOP_P:
        top_p = tl.load(top_p_ptr + rows, mask=row_mask, other=1.0)
        total, _ = _mass(logits_ptr, row_off, row_mask, V, row_max, t, floor, log_z, entropy, tau, cap,
                         BLOCK_R, BLOCK_V)  # fmt: skip
        t_p = _largest_weight_threshold(logits_ptr, row_off, row_mask, V, row_max, t, floor, log_z, entropy, tau, cap,
                                        0, top_p * total, True, BLOCK_R, BLOCK_V)  # fmt: skip
        t = tl.where(top_p < 1.0, t_p, t)
    if HAS_TYPICAL_P:
        typical_p = tl.load(typical_p_ptr + rows, mask=row_mask, other=1.0)
        z, w_log_w = _mass(logits_ptr, row_off, row_mask, V, row_max, t, floor, log_z, entropy, tau, cap,
                           BLOCK_R, BLOCK_V)  # fmt: skip
        log_z = tl.log(z)
        entropy = log_z - w_log_w / z
        tau_p = _smallest_score_threshold(logits_ptr, row_off, row_mask, V, row_max, t, floor, log_z, entropy, cap,
                                          typical_p * z, BLOCK_R, BLOCK_V)  # fmt: skip
        tau = tl.where(typical_p < 1.0, tau_p, tau)
    if HAS_TOP_N_SIGMA:
        n_sigma = tl.load(n_sigma_ptr + rows, mask=row_mask, other=0.0)
        top, std = _logit_spread(logits_ptr, row_off, row_mask, V, row_max, t, floor, log_z, entropy, tau, cap,
                                 BLOCK_R, BLOCK_V)  # fmt: skip
        floor = tl.where(n_sigma > 0, top - n_sigma * std, floor)
    if HAS_XTC:
        threshold = tl.load(xtc_threshold_ptr + rows, mask=row_mask, other=1.0)
        probability = tl.load(xtc_probability_ptr + rows, mask=row_mask, other=0.0)
        z_x, _ = _mass(logits_ptr, row_off, row_mask, V, row_max, t, floor, log_z, entropy, tau, cap,
                       BLOCK_R, BLOCK_V)  # fmt: skip
        count, _, smallest, _ = _probe(logits_ptr, row_off, row_mask, V, row_max, t, floor, log_z, entropy, tau, cap,
                                       threshold * z_x, False, BLOCK_R, BLOCK_V)  # fmt: skip
        coin = _uniform(key, tl.full([BLOCK_R], -1, tl.int64))
        active = (count >= 2) & (coin <= probability) & (threshold <= 0.5) & (probability > 0)
        cap = tl.where(active, smallest, cap)
    best = tl.full([BLOCK_R], -1.0, tl.float32)
    best_idx = tl.zeros([BLOCK_R], tl.int64)
    draft = tl.full([BLOCK_R], -1, tl.int64)
    if HAS_DRAFTS:
        draft = tl.load(draft_ptr + rows, mask=row_mask, other=-1)
    mass = tl.zeros([BLOCK_R], tl.float32)
    draft_w = tl.zeros([BLOCK_R], tl.float32)
    for start in range(0, V, BLOCK_V):
        cols, x, w, keep = _kept_chunk(logits_ptr, row_off, row_mask, start, V, row_max, t, floor, log_z, entropy,
                                       tau, cap, BLOCK_V)  # fmt: skip
        racing = keep
        if HAS_DRAFTS:
            is_draft = cols.to(tl.int64)[None, :] == draft[:, None]
            mass += tl.sum(tl.where(keep, w, 0.0), axis=1)
            draft_w += tl.sum(tl.where(keep & is_draft, w, 0.0), axis=1)
            racing = keep & ~is_draft
        u = _uniform(key[:, None], cols.to(tl.int64)[None, :])
        score = tl.where(racing, w / -tl.log(u), -1.0)
        best, best_idx = merge_winner(score, start, best, best_idx)
        if WRITE_PROCESSED:
            offsets = row_off[:, None] + cols[None, :]
            mask = row_mask[:, None] & (cols < V)[None, :]
            logits = tl.load(logits_ptr + offsets, mask=mask, other=float("-inf"))
            tl.store(processed_ptr + offsets, tl.where(keep, logits, float("-inf")), mask=mask)
    if HAS_DRAFTS:
        coin = _uniform(key, tl.full([BLOCK_R], -2, tl.int64))
        accepted = (draft >= 0) & ((coin <= draft_w / mass) | (best <= 0.0))
        best_idx = tl.where(accepted, draft, best_idx)
        tl.store(accepted_ptr + rows, accepted.to(tl.int8), mask=row_mask)
    tl.store(token_ptr + rows, best_idx, mask=row_mask)
