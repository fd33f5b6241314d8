"""Seed invariance: a seeded request's tokens do not depend on its row or on the rest of the batch."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sampling.batch import SamplingBatch
from sampling.ops.seeded_noise import MASK32, fmix32, row_keys, seed_key
from sampling.params import SamplingParams
from sampling.sampler import Sampler

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
VOCAB = 200
STEPS = 8
SEEDED = SamplingParams(temperature=0.9, top_k=50, top_p=0.9, seed=1234)
PATHS = pytest.mark.parametrize("use_triton", [False, True], ids=["torch", "triton"])
FOLDED_TO_ONE_KEY = (0, 7047780877)
"""Issue 13's pair: a 32-bit fold of the seed gave both the same key, so the same tokens."""


def other_params(i: int) -> SamplingParams:
    """A mix of greedy, unseeded and seeded rows, including ones that force the full-sort path."""
    kinds = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0),  # no truncation: whole vocabulary
        SamplingParams(top_p=0.8),
        SamplingParams(top_k=5, seed=i),
        SamplingParams(min_p=0.1, typical_p=0.9, seed=i + 1000),
    ]
    return kinds[i % len(kinds)]


def run(row: int, batch_size: int, use_triton: bool, step_logits: list[torch.Tensor], seed: int = 1234) -> list[int]:
    """Tokens of the SEEDED request (with ``seed``) placed at ``row`` among ``batch_size - 1`` other rows."""
    batch = SamplingBatch(batch_size, VOCAB, 64, DEVICE)
    seeded = SEEDED.model_copy(update={"seed": seed})
    for r in range(batch_size):
        batch.add_request(r, seeded if r == row else other_params(r), [1, 2, 3])
    sampler = Sampler(use_triton=use_triton)
    rows = torch.arange(batch_size, device=DEVICE)
    tokens = []
    for logits in step_logits:
        full = torch.randn(batch_size, VOCAB, device=DEVICE) * 2
        full[row] = logits
        tokens.append(int(sampler(full, rows, batch).sampled_token_ids[row]))
    return tokens


@PATHS
def test_seeded_request_is_batch_and_row_invariant(use_triton: bool) -> None:
    g = torch.Generator().manual_seed(0)
    step_logits = [(torch.randn(VOCAB, generator=g) * 2).to(DEVICE) for _ in range(STEPS)]
    alone = run(0, 1, use_triton, step_logits)
    in_batch = run(17, 64, use_triton, step_logits)
    moved = run(50, 64, use_triton, step_logits)
    assert alone == in_batch == moved
    assert len(set(alone)) > 1  # really sampled, not stuck on the argmax


@pytest.mark.parametrize("seed", [1234, *FOLDED_TO_ONE_KEY, 2**64 - 1, -(2**63)])
def test_torch_and_triton_paths_agree_on_seeded_tokens(seed: int) -> None:
    g = torch.Generator().manual_seed(1)
    step_logits = [(torch.randn(VOCAB, generator=g) * 2).to(DEVICE) for _ in range(STEPS)]
    assert run(3, 8, False, step_logits, seed) == run(3, 8, True, step_logits, seed)


@PATHS
def test_seeds_equal_in_a_32_bit_fold_give_different_tokens(use_triton: bool) -> None:
    g = torch.Generator().manual_seed(2)
    step_logits = [(torch.randn(VOCAB, generator=g) * 2).to(DEVICE) for _ in range(STEPS)]
    first, second = (run(0, 1, use_triton, step_logits, seed) for seed in FOLDED_TO_ONE_KEY)
    assert first != second


def keys_over_positions(seed: int, positions: int = STEPS) -> list[int]:
    """The row keys of a seeded row at output positions 0..positions-1."""
    keys = torch.full((positions,), seed_key(seed), dtype=torch.int64)
    return row_keys(keys, torch.ones(positions, dtype=torch.bool), torch.arange(positions)).tolist()


def folded_32(seed: int) -> int:
    """The 32-bit fold of a seed used before (low half ^ fmix32(high half ^ golden), mixed)."""
    low, high = seed % 2**64 & MASK32, seed % 2**64 >> 32
    return int(fmix32(torch.tensor(low) ^ fmix32(torch.tensor(high ^ 0x9E3779B9))))


def partner_in_the_fold(seed: int, high: int) -> int:
    """A seed with high half ``high`` that the 32-bit fold maps to the same key as ``seed``."""
    low, old_high = seed & MASK32, seed >> 32
    mixed = fmix32(torch.tensor([old_high ^ 0x9E3779B9, high ^ 0x9E3779B9]))
    return high << 32 | (low ^ int(mixed[0]) ^ int(mixed[1]))


SEEDS = st.integers(0, 2**64 - 1)


@given(SEEDS, st.integers(1, MASK32))
@settings(max_examples=200, deadline=None)
def test_seeds_differing_in_the_high_bits_differ_at_every_position(seed: int, high_flip: int) -> None:
    other = seed ^ (high_flip << 32)
    assert seed_key(seed) != seed_key(other)
    assert all(a != b for a, b in zip(keys_over_positions(seed), keys_over_positions(other)))


@given(SEEDS, st.integers(0, MASK32))
@settings(max_examples=200, deadline=None)
def test_seeds_a_32_bit_fold_confuses_give_different_streams(seed: int, high: int) -> None:
    other = partner_in_the_fold(seed, high)
    if other == seed:
        return
    assert folded_32(seed) == folded_32(other)
    assert keys_over_positions(seed) != keys_over_positions(other)


@given(st.integers(-(2**63), 2**64 - 1), st.integers(-(2**63), 2**64 - 1))
@settings(max_examples=200, deadline=None)
def test_distinct_seeds_give_distinct_keys(seed: int, other: int) -> None:
    """Seeds equal modulo 2**64 (-1 and 2**64 - 1) are one seed, as for torch.Generator.manual_seed."""
    assert (seed_key(seed) == seed_key(other)) == (seed % 2**64 == other % 2**64)
    if seed % 2**64 != other % 2**64:
        assert keys_over_positions(seed) != keys_over_positions(other)


def test_unseeded_rows_differ_between_rows() -> None:
    batch = SamplingBatch(64, VOCAB, 16, DEVICE)
    for r in range(64):
        batch.add_request(r, SamplingParams(), [0])
    logits = torch.zeros(64, VOCAB, device=DEVICE)
    tokens = Sampler()(logits, torch.arange(64, device=DEVICE), batch).sampled_token_ids
    assert len(set(tokens.tolist())) > 32
