"""The race noise of `sampling.ops.seeded_noise` in Triton, on native uint32 (bit-identical to the torch path),
and the race's running winner over vocabulary chunks.

A token's race key is ``x - log(q)`` with ``x`` its temperature-scaled logit and ``q = -log(u)``
its Exp(1) noise: the largest key is the largest ``p / q`` (the exponential race), taken in log
space so that it needs no row maximum and never underflows.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def fmix32(x):
    """MurmurHash3's 32-bit finaliser on uint32 tensors (multiplies wrap modulo 2**32)."""
    x = x ^ (x >> 16)
    x = x * 0x85EBCA6B
    x = x ^ (x >> 13)
    x = x * 0xC2B2AE35
    return x ^ (x >> 16)


@triton.jit
def row_key(seed_key, has_seed, output_pos, random_key):
    """A row's uint32 key, as `sampling.ops.seeded_noise.row_keys`: seed_key, output_pos and random_key
    int64 [R] (random_key in [0, 2**32)), has_seed bool [R]."""
    low = (seed_key & 0xFFFFFFFF).to(tl.uint32)
    high = ((seed_key >> 32) & 0xFFFFFFFF).to(tl.uint32)
    seeded = fmix32(low ^ fmix32(high ^ fmix32((output_pos & 0xFFFFFFFF).to(tl.uint32))))
    return tl.where(has_seed, seeded, random_key.to(tl.uint32))


@triton.jit
def uniform32(key, token):
    """u in (0, 1) float32: key uint32 [R, 1] (or [R]) against token ids uint32 [1, C] (or [C]), broadcast."""
    h = fmix32(key ^ fmix32(token * 0x9E3779B9 + 0x632BE5AB))
    return ((h >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)


@triton.jit
def race_key(x, key, cols):
    """x - log(q): x [R, C] scaled logits, key [R] uint32 row keys, cols [C] int32 token ids."""
    u = uniform32(key[:, None], cols.to(tl.uint32)[None, :])
    return x - tl.log(-tl.log(u))


@triton.jit
def merge_winner(score, start, best, best_idx):
    """The running winner (best [R], best_idx [R] int64) after the chunk at ``start`` with scores [R, C]:
    a chunk's first maximum replaces it only when strictly larger, so ties go to the lowest token id."""
    block_best = tl.max(score, axis=1)
    block_idx = tl.argmax(score, axis=1).to(tl.int64) + start
    better = block_best > best
    return tl.where(better, block_best, best), tl.where(better, block_idx, best_idx)
