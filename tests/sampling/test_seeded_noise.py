"""The noise's fast paths compute the same bits as the uint32 definition: the int32 hash, a wide
race taken a few rows at a time, and the whole-vocabulary race with its softmax in chunks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sampling.ops.draw as draw_module
from sampling.ops.draw import draw, exponential_race, whole_vocab_race
from sampling.ops.seeded_noise import MASK32, UNIFORM_BITS, fmix32, token_mix, uniform
from sampling.ops.truncation import whole_vocab

EDGE_UINT32 = [0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, MASK32]


def uniform_by_definition(row_key: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """`uniform` on uint32 values held in int64, as the Triton kernel computes it."""
    h = fmix32(row_key.view(-1, 1) ^ token_mix(token_ids))
    return ((h >> (32 - UNIFORM_BITS)).float() + 0.5) * (2.0**-UNIFORM_BITS)


@settings(max_examples=200, deadline=None)
@given(
    keys=st.lists(st.one_of(st.sampled_from(EDGE_UINT32), st.integers(0, MASK32)), min_size=1, max_size=8),
    token_ids=st.lists(st.integers(0, 2**20), min_size=1, max_size=64),
)
def test_uniform_equals_its_uint32_definition(keys, token_ids):
    keys_t, ids_t = torch.tensor(keys, dtype=torch.int64), torch.tensor(token_ids, dtype=torch.int64)
    assert torch.equal(uniform(keys_t, ids_t), uniform_by_definition(keys_t, ids_t))


def test_uniform_equals_its_definition_over_a_whole_vocabulary():
    keys = torch.tensor(EDGE_UINT32 + [0x12345678, 0x9ABCDEF0], dtype=torch.int64)
    ids = torch.arange(151_936)
    assert torch.equal(uniform(keys, ids), uniform_by_definition(keys, ids))


@pytest.mark.parametrize("per_row_ids", [False, True])
def test_a_race_taken_a_few_rows_at_a_time_has_the_same_winners(monkeypatch, per_row_ids):
    generator = torch.Generator().manual_seed(0)
    rows, width = 37, 5000
    weights = torch.softmax(3 * torch.randn(rows, width, generator=generator), dim=-1)
    token_ids = torch.randperm(width, generator=generator)
    if per_row_ids:
        token_ids = torch.stack([torch.randperm(width, generator=generator) for _ in range(rows)])
    keys = torch.randint(0, 2**32, (rows,), dtype=torch.int64, generator=generator)
    monkeypatch.setattr(draw_module, "RACE_CHUNK_ELEMENTS", rows * width)
    whole = exponential_race(weights, token_ids, keys)
    monkeypatch.setattr(draw_module, "RACE_CHUNK_ELEMENTS", 3 * width)  # 3 rows at a time, the last chunk 1 row
    assert torch.equal(exponential_race(weights, token_ids, keys), whole)


def test_the_whole_vocabulary_race_draws_what_the_candidates_draw(monkeypatch):
    generator = torch.Generator().manual_seed(1)
    rows, vocab = 9, 3000
    logits = 4 * torch.randn(rows, vocab, generator=generator)
    logits[0, :2990] = float("-inf")  # a masked row: removed tokens have probability exactly 0
    logits[1, 5] = 1e4  # one token takes all the mass
    temperature = torch.linspace(0.2, 1.8, rows)
    keys = torch.randint(0, 2**32, (rows,), dtype=torch.int64, generator=generator)
    expected = draw(whole_vocab(logits / temperature[:, None]), keys)
    monkeypatch.setattr(draw_module, "RACE_CHUNK_ELEMENTS", 2 * vocab)
    assert torch.equal(whole_vocab_race(logits, temperature, keys), expected)
    assert whole_vocab_race(logits, temperature, keys)[1] == 5 and whole_vocab_race(logits, temperature, keys)[0] >= 2990
