"""Counter-based noise for the exponential race.

All arithmetic is on uint32 values held in int64 tensors, so torch (CPU, CUDA) and
the Triton kernels (native uint32) compute bit-identical hashes. The noise of token
``t`` in a row is ``-log(u)`` with ``u = uniform(fmix32(row_key ^ token_mix(t)))``.

* A seeded row's key is ``fmix32(lo ^ fmix32(hi ^ fmix32(output_position)))`` with
  ``lo`` / ``hi`` the low and high 32 bits of the seed: a function of (seed, output
  position) only, so its tokens do not depend on the batch. Every one of the seed's 64
  bits counts: two seeds that differ in one half only give different keys at every
  position (``fmix32`` is a bijection), and any two distinct seeds differ at a position
  except with chance 2**-32, independently from position to position.
* An unseeded row's key is drawn from the device's default generator each step.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B9
TOKEN_SALT = 0x632BE5AB
UNIFORM_BITS = 23
"""``u = ((h >> 9) + 0.5) / 2**23`` lies strictly inside (0, 1), so ``-log(u)`` is finite and > 0."""


def fmix32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser on uint32 values stored in an int64 tensor (any shape)."""
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & MASK32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & MASK32
    return x ^ (x >> 16)


def seed_key(seed: int) -> int:
    """The seed's 64 bits as a signed int64 (a batch column): distinct keys for distinct seeds modulo 2**64.

    ``SamplingParams.seed`` takes [-2**63, 2**64); a negative seed is its two's complement,
    as ``torch.Generator.manual_seed`` takes it (-1 and 2**64 - 1 are the same seed).
    """
    return (seed + 2**63) % 2**64 - 2**63


def token_mix(token_ids: torch.Tensor) -> torch.Tensor:
    """Per-token-id hash input, any shape int64 -> same shape uint32-in-int64."""
    return fmix32((token_ids * GOLDEN + TOKEN_SALT) & MASK32)


def row_keys(seed_keys: torch.Tensor, has_seed: torch.Tensor, output_pos: torch.Tensor) -> torch.Tensor:
    """Per-row uint32 keys for this step, all [n]: seeded rows from (seed, position), others random.

    seed_keys: `seed_key` of each row's seed, int64.
    """
    low, high = seed_keys & MASK32, (seed_keys >> 32) & MASK32
    seeded = fmix32(low ^ fmix32(high ^ fmix32(output_pos & MASK32)))
    return torch.where(has_seed, seeded, random_keys(seeded.shape[0], seeded.device))


def random_keys(num_rows: int, device: torch.device) -> torch.Tensor:
    """[num_rows] uint32-in-int64 keys from the device's default generator: the unseeded rows' keys of a step."""
    return torch.randint(0, 2**32, (num_rows,), dtype=torch.int64, device=device)


def uniform(row_key: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """u in (0, 1) float32, [n, K]: row_key [n] (or [n, 1]) against token_ids [n, K] or [K]."""
    return uniform_of_mixes(row_key, token_mixes(token_ids))


def exponential_of_mixes(row_key: torch.Tensor, mixes: torch.Tensor) -> torch.Tensor:
    """Exp(1) noise q > 0, float32 [n, K], a pure function of (row key, token id): ``-log(uniform)``."""
    return uniform_of_mixes(row_key, mixes).log_().neg_()


def token_mixes(token_ids: torch.Tensor) -> torch.Tensor:
    """`token_mix` as int32 (the same 32 bits), any shape: computed once, hashed against many rows."""
    return _as_int32(token_mix(token_ids))


def uniform_of_mixes(row_key: torch.Tensor, mixes: torch.Tensor) -> torch.Tensor:
    """`uniform` from `token_mixes` ([n, K] or [K]) and row_key [n]: the [n, K] hash runs in place
    on int32, with the bits of the uint32 definition (multiplies wrap modulo 2**32; each right
    shift masks off the copies of the sign bit)."""
    x = _as_int32(row_key.view(-1, 1)) ^ mixes
    x ^= (x >> 16) & 0xFFFF
    x *= 0x85EBCA6B - 2**32
    x ^= (x >> 13) & 0x7FFFF
    x *= 0xC2B2AE35 - 2**32
    x ^= (x >> 16) & 0xFFFF
    bits = (x >> (32 - UNIFORM_BITS)) & ((1 << UNIFORM_BITS) - 1)
    return bits.float().add_(0.5).mul_(2.0**-UNIFORM_BITS)


def _as_int32(x: torch.Tensor) -> torch.Tensor:
    """uint32 values held in int64 -> the int32 with the same 32 bits."""
    return (x - ((x >> 31) << 32)).to(torch.int32)
