"""Sorting-free min-p / top-k / top-p + draw by checking the race's winner, in a few passes over [B, V].

With ``x`` a token's scaled logit, ``w = exp(x - max)`` its weight and ``q`` its Exp(1) race
noise (`sampling.triton.noise`), the drawn token is the kept token with the largest ``x - log q``.
min-p, top-k and top-p (and any combination, applied in that order as `sampling.ops.truncation`
does) keep an *upper set* by weight: ``{w >= T}`` for one threshold ``T``. So if the race over a
superset ``S`` of the kept set is won by a kept token, that token also wins the race over the kept
set, and nothing else needs to be known about ``T``. Whether a token of weight ``c`` is kept needs
only sums over the row at ``c``:

* min-p: ``c >= min_p``;
* top-k: ``count(w > c) < k`` (counted over min-p's kept set);
* top-p: ``mass(w > c) < top_p * M`` with ``M`` the mass kept by min-p and top-k.

Per row (one program per row on a GPU):

1. pass 1: the row maximum and the race over every finite logit (greedy rows: the argmax, and done);
2. each further pass checks the candidate (the last race winner) at its weight ``c`` and, in the same
   pass, runs the race over ``{w > c}`` in case it is rejected. Accepted: done. Rejected: every kept
   token has ``w > c``, so the speculative winner is the next candidate (when it is inside what is
   now known to hold the kept set).

``M`` is known without ``T`` except with top-k and top-p together, where it needs top-k's threshold
unless the candidate's counts fix it. The k-th largest weight comes from a radix select on the float32
bits of ``w`` that runs beside the checks from the first one (and starts when a candidate fails top-k
alone): a ``NUM_BINS``-bin count histogram per pass narrows its bracket by ``log2(NUM_BINS)`` bits (6
for 64 bins), and the masses above and below the bracket bound ``M``, so that most candidates
are decided before the select ends.

LM-shaped rows need 2-3 passes (1 with no truncation, or when min-p alone keeps the first winner); each
row counts its passes into ``passes`` [B]. The kept set equals the sort-based definition (ties at a
boundary all kept), with the same weights as `sampling.triton.kernels`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from sampling.triton.noise import merge_winner, race_key, row_key

ONE_BITS_PLUS_ONE = tl.constexpr(0x3F800001)  # bits(1.0) + 1: above every weight
MAX_PASSES = tl.constexpr(4096)  # a bound that only malformed rows (NaN logits) reach


@triton.jit
def _scaled(logits_ptr, row_off, live, cols, V, temperature):
    """x [R, C]: the logits of columns ``cols`` [C] of the ``live`` [R] rows divided by temperature [R]; -inf elsewhere."""
    mask = live[:, None] & (cols < V)[None, :]
    logits = tl.load(logits_ptr + row_off[:, None] + cols[None, :], mask=mask, other=float("-inf"))
    return logits / temperature[:, None]


@triton.jit
def _scaled_at(logits_ptr, row_off, live, col, temperature):
    """x [R] at one column per row (col [R] int64); -inf where not ``live``."""
    return tl.load(logits_ptr + row_off + col, mask=live, other=float("-inf")) / temperature


@triton.jit
def _first_pass(logits_ptr, row_off, live, greedy, key, V, temperature,
                BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """(row max [R], winner [R] int64): the race's winner over finite logits, or the first argmax for greedy rows."""
    row_max = tl.full([BLOCK_R], float("-inf"), tl.float32)
    best = tl.full([BLOCK_R], float("-inf"), tl.float32)
    best_idx = tl.zeros([BLOCK_R], tl.int64)
    drawing = tl.max((live & ~greedy).to(tl.int32), axis=0) > 0  # greedy programs hash nothing
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x = _scaled(logits_ptr, row_off, live, cols, V, temperature)
        row_max = tl.maximum(row_max, tl.max(x, axis=1))
        score = x
        if drawing:
            score = tl.where(greedy[:, None], x, race_key(x, key, cols))
        best, best_idx = merge_winner(score, start, best, best_idx)
    return row_max, best_idx


@triton.jit
def _check_pass(logits_ptr, row_off, live, key, V, temperature, row_max, t_lo, excl, cw, t_min, searching,
                k_lo, shift, k_hi, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, NUM_BINS: tl.constexpr):  # fmt: skip
    """One pass: sums at the candidate weight ``cw`` [R], the race over ``{w >= t_lo, w > excl, w > cw}``,
    and, for ``searching`` rows, the count histogram of the weights >= ``t_min`` in the bracket [k_lo, k_hi).

    Returns (winner [R] int64, its weight [R] as this pass computed it (0 where none), found [R],
    count(w > cw), count(w >= cw), mass(w > cw), mass(w >= cw), mass(w >= t_lo), histogram
    [R, 2 * NUM_BINS] int32 (bin NUM_BINS and up: outside), count(w >= k_hi), mass(w >= k_hi),
    mass(w >= k_lo)); the last three over the weights >= ``t_min`` (brackets as float32 bits).

    The winner's weight is taken from this loop, not recomputed: a GPU compiles the loop's
    ``exp(x / t - max)`` and a scalar recomputation differently (an ulp apart), and a next candidate
    whose weight disagrees with the one the next pass compares against can be raced again and again.
    """
    best = tl.full([BLOCK_R], float("-inf"), tl.float32)
    best_idx = tl.zeros([BLOCK_R], tl.int64)
    best_w = tl.zeros([BLOCK_R], tl.float32)
    cnt_gt = tl.zeros([BLOCK_R], tl.int32)
    cnt_ge = tl.zeros([BLOCK_R], tl.int32)
    mass_gt = tl.zeros([BLOCK_R], tl.float32)
    mass_ge = tl.zeros([BLOCK_R], tl.float32)
    mass_lo = tl.zeros([BLOCK_R], tl.float32)
    hist = tl.zeros([BLOCK_R, 2 * NUM_BINS], tl.int32)
    above = tl.zeros([BLOCK_R], tl.int32)
    mass_khi = tl.zeros([BLOCK_R], tl.float32)
    mass_klo = tl.zeros([BLOCK_R], tl.float32)
    any_search = tl.max(searching.to(tl.int32), axis=0) > 0
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x = _scaled(logits_ptr, row_off, live, cols, V, temperature)
        w = tl.exp(x - row_max[:, None])
        finite = x > float("-inf")
        gt = finite & (w > cw[:, None])
        ge = finite & (w >= cw[:, None])
        low = finite & (w >= t_lo[:, None])
        cnt_gt += tl.sum(gt.to(tl.int32), axis=1)
        cnt_ge += tl.sum(ge.to(tl.int32), axis=1)
        mass_gt += tl.sum(tl.where(gt, w, 0.0), axis=1)
        mass_ge += tl.sum(tl.where(ge, w, 0.0), axis=1)
        mass_lo += tl.sum(tl.where(low, w, 0.0), axis=1)
        bits = w.to(tl.int32, bitcast=True)
        counted = finite & (w >= t_min[:, None]) & (bits >= k_lo[:, None])
        mass_klo += tl.sum(tl.where(counted, w, 0.0), axis=1)
        mass_khi += tl.sum(tl.where(counted & (bits >= k_hi[:, None]), w, 0.0), axis=1)
        racing = gt & low & (w > excl[:, None])
        score = tl.where(racing, race_key(x, key, cols), float("-inf"))
        best, best_idx = merge_winner(score, start, best, best_idx)
        in_chunk = cols[None, :].to(tl.int64) == best_idx[:, None]  # one column where the winner moved here
        moved = (best_idx >= start) & (best > float("-inf"))
        best_w = tl.where(moved, tl.sum(tl.where(in_chunk, w, 0.0), axis=1), best_w)
        if any_search:
            counted &= searching[:, None]
            above += tl.sum((counted & (bits >= k_hi[:, None])).to(tl.int32), axis=1)
            inside = counted & (bits < k_hi[:, None])
            bins = tl.where(inside, (bits - k_lo[:, None]) >> shift[:, None], NUM_BINS)
            bins += (tl.arange(0, BLOCK_R) * (2 * NUM_BINS))[:, None]
            flat = tl.histogram(tl.reshape(bins, [BLOCK_R * BLOCK_V]), BLOCK_R * 2 * NUM_BINS)
            hist += tl.reshape(flat, [BLOCK_R, 2 * NUM_BINS])
    return best_idx, best_w, best > float("-inf"), cnt_gt, cnt_ge, mass_gt, mass_ge, mass_lo, hist, above, mass_khi, mass_klo


@triton.jit
def _bin_shift(k_lo, k_hi, NUM_BINS: tl.constexpr):
    """[R] the smallest shift s with (k_hi - k_lo - 1) >> s < NUM_BINS."""
    span = tl.maximum(k_hi - k_lo - 1, 0)
    shift = tl.zeros_like(span)
    for _ in range(31):
        shift += ((span >> shift) >= NUM_BINS).to(tl.int32)
    return shift


@triton.jit
def _narrow(hist, above, k, k_lo, k_hi, shift, NUM_BINS: tl.constexpr):
    """The bracket [k_lo, k_hi) of the k-th largest weight's bits narrowed to one bin of ``hist`` [R, 2 * NUM_BINS];
    also whether fewer than k weights lie at or above ``k_lo`` (no k-th weight)."""
    idx = tl.arange(0, 2 * NUM_BINS)[None, :]
    counts = tl.where(idx < NUM_BINS, hist, 0)
    at_or_above = tl.sum(counts, axis=1)[:, None] - tl.cumsum(counts, axis=1) + counts + above[:, None]
    reaching = (at_or_above >= k[:, None]) & (idx < NUM_BINS)
    b = tl.max(tl.where(reaching, idx, -1), axis=1)
    none = b < 0
    new_lo = k_lo + (tl.maximum(b, 0) << shift)
    new_hi = tl.minimum(k_hi, new_lo + ((shift * 0 + 1) << shift))
    return tl.where(none, k_lo, new_lo), tl.where(none, k_lo + 1, new_hi), none


@triton.jit
def top_set_sample_kernel(
    logits_ptr, stride, temperature_ptr, greedy_ptr, min_p_ptr, top_k_ptr, top_p_ptr,
    seed_key_ptr, has_seed_ptr, output_pos_ptr, random_key_ptr, token_ptr, passes_ptr, n_rows, V,
    HAS_MIN_P: tl.constexpr, HAS_TOP_K: tl.constexpr, HAS_TOP_P: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, NUM_BINS: tl.constexpr,
):  # fmt: skip
    """logits [n, V] (row stride ``stride``), temperature / min_p / top_p [n] float32, top_k [n] int64,
    greedy [n] bool; each row's race key (`noise.row_key`) from seed_key / output_pos / random_key [n] int64 and
    has_seed [n] bool -> token [n] int64 (greedy rows: the first argmax), passes [n] int32."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_mask = rows < n_rows
    row_off = rows.to(tl.int64) * stride
    greedy = tl.load(greedy_ptr + rows, mask=row_mask, other=0) != 0
    temperature = tl.load(temperature_ptr + rows, mask=row_mask, other=1.0)
    key = row_key(
        tl.load(seed_key_ptr + rows, mask=row_mask, other=0),
        tl.load(has_seed_ptr + rows, mask=row_mask, other=0) != 0,
        tl.load(output_pos_ptr + rows, mask=row_mask, other=0),
        tl.load(random_key_ptr + rows, mask=row_mask, other=0),
    )
    row_max, token = _first_pass(logits_ptr, row_off, row_mask, greedy, key, V, temperature, BLOCK_R, BLOCK_V)
    passes = row_mask.to(tl.int32)
    t_min = tl.zeros([BLOCK_R], tl.float32)
    if HAS_MIN_P:
        t_min = tl.maximum(t_min, tl.load(min_p_ptr + rows, mask=row_mask, other=0.0))
    k = tl.zeros([BLOCK_R], tl.int32)
    if HAS_TOP_K:
        k = tl.load(top_k_ptr + rows, mask=row_mask, other=0).to(tl.int32)
    top_p = tl.full([BLOCK_R], 1.0, tl.float32)
    if HAS_TOP_P:
        top_p = tl.load(top_p_ptr + rows, mask=row_mask, other=1.0)
    has_k = k > 0
    has_p = top_p < 1.0
    # The first winner: kept outright when only min-p applies; otherwise checked by the passes below.
    cw = tl.exp(_scaled_at(logits_ptr, row_off, row_mask, token, temperature) - row_max)
    cand_ok = cw >= t_min
    pending = row_mask & ~greedy & (row_max > float("-inf")) & (has_k | has_p | ~cand_ok)
    t_lo = t_min
    excl = tl.full([BLOCK_R], -1.0, tl.float32)
    k_known = ~has_k
    # With top-k and top-p, top-p's mass needs top-k's threshold: its search starts with the first check.
    searching = pending & has_k & has_p
    k_lo = t_min.to(tl.int32, bitcast=True)
    k_hi = tl.full([BLOCK_R], ONE_BITS_PLUS_ONE, tl.int32)
    while tl.max(pending.to(tl.int32), axis=0) > 0:
        passes += pending.to(tl.int32)
        cw_now = tl.where(cand_ok, cw, -1.0)
        shift = _bin_shift(k_lo, k_hi, NUM_BINS)
        nxt, nxt_w, found, cnt_gt, cnt_ge, mass_gt, mass_ge, mass_lo, hist, above, mass_khi, mass_klo = _check_pass(
            logits_ptr, row_off, pending, key, V, temperature, row_max, t_lo, excl, cw_now, t_min, searching & pending,
            k_lo, shift, k_hi, BLOCK_R, BLOCK_V, NUM_BINS)  # fmt: skip
        # Is the candidate kept? Top-p's mass M is known unless top-k's threshold is (then it lies in the
        # bracket [k_lo, k_hi), and below the candidate when fewer than k weights reach it: bounds on M).
        ok_k = k_known | (cnt_gt < k)
        at_k = ~k_known & (cnt_gt < k) & (cnt_ge >= k)
        p_known = ~has_p | k_known | at_k
        mass = tl.where(at_k, mass_ge, mass_lo)
        ok_p = ~has_p | (mass_gt < top_p * mass)
        least = tl.maximum(mass_khi, tl.where(cnt_ge < k, mass_ge, 0.0))
        sure_in = has_p & (mass_gt < top_p * least)
        sure_out = has_p & (mass_gt >= top_p * tl.minimum(mass_klo, mass_lo))
        accept = pending & cand_ok & ok_k & tl.where(p_known, ok_p, sure_in)
        reject = pending & cand_ok & (~ok_k | tl.where(p_known, ~ok_p, sure_out))
        undecided = pending & cand_ok & ~accept & ~reject
        # The k-th largest weight: narrow the bracket of the rows that searched this pass, then start new searches.
        new_lo, new_hi, none = _narrow(hist, above, k, k_lo, k_hi, shift, NUM_BINS)
        searched = searching & pending
        k_lo = tl.where(searched, new_lo, k_lo)
        k_hi = tl.where(searched, new_hi, k_hi)
        found_k = searched & (none | (k_hi - k_lo <= 1))
        t_k = tl.where(none, 0.0, k_lo.to(tl.float32, bitcast=True))
        t_lo = tl.where(found_k, tl.maximum(t_lo, t_k), t_lo)
        k_known |= found_k
        searching &= ~found_k
        start = pending & ~k_known & ~searching & (undecided | (reject & ~ok_k))
        cw_bits = cw.to(tl.int32, bitcast=True)
        k_lo = tl.where(start, tl.where(ok_k, t_min.to(tl.int32, bitcast=True), cw_bits + 1), k_lo)
        k_hi = tl.where(start, tl.where(ok_k, cw_bits, ONE_BITS_PLUS_ONE), k_hi)
        searching |= start
        # A rejected candidate (or one below top-k's threshold, now known) gives way to the speculative winner.
        dropped = reject | (undecided & (cw < t_lo))
        excl = tl.where(dropped, cw, excl)
        replace = pending & ~accept & (dropped | ~cand_ok)
        token = tl.where(replace, nxt, token)
        cw = tl.where(replace, nxt_w, cw)
        cand_ok = tl.where(replace, found & (nxt_w >= t_lo) & (nxt_w > excl), cand_ok)
        # Only min-p (or a known top-k threshold) left to check: a candidate inside [t_lo, ...) is kept.
        settled = replace & cand_ok & ~has_p & k_known
        pending &= ~accept & ~settled & (passes < MAX_PASSES)
    tl.store(token_ptr + rows, token, mask=row_mask)
    tl.store(passes_ptr + rows, passes, mask=row_mask)
