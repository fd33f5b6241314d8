"""The grammar bitmask stage: applied on the device as a bit-by-bit reference would, and a
constrained row with no token left emits -1 and records nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sampling.batch import SamplingBatch
from sampling.ops.masks import GrammarMask, apply_grammar_mask, rows_left_empty
from sampling.params import SamplingParams
from sampling.sampler import Sampler

VOCAB = 100  # not a multiple of 32: the last word's high bits lie past the vocabulary
PATHS = pytest.mark.parametrize("use_triton", [False, True], ids=["torch", "triton"])
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the Triton path runs natively there, interpreted here


def reference_mask(logits: np.ndarray, bitmask: np.ndarray, rows: list[int]) -> np.ndarray:
    """Token by token: -inf where the row's bit is clear."""
    out = logits.copy()
    for mask_row, row in enumerate(rows):
        for token in range(logits.shape[1]):
            word = int(bitmask[mask_row, token // 32]) & 0xFFFFFFFF
            if not (word >> (token % 32)) & 1:
                out[row, token] = -np.inf
    return out


@settings(max_examples=60, deadline=None)
@given(data=st.data(), num_rows=st.integers(1, 6), vocab=st.integers(1, 130))
def test_mask_application_equals_the_bit_by_bit_reference(data, num_rows, vocab):
    rows = data.draw(st.lists(st.integers(0, num_rows - 1), unique=True, min_size=1, max_size=num_rows))
    words = (vocab + 31) // 32
    bitmask = np.array(data.draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=len(rows) * words, max_size=len(rows) * words)), dtype=np.int32)
    bitmask = bitmask.reshape(len(rows), words)
    logits = np.random.default_rng(0).standard_normal((num_rows, vocab)).astype(np.float32)
    applied = torch.from_numpy(logits.copy())
    apply_grammar_mask(applied, GrammarMask(torch.from_numpy(bitmask), torch.tensor(rows)))
    np.testing.assert_array_equal(applied.numpy(), reference_mask(logits, bitmask, rows))


def test_rows_left_empty_marks_only_the_given_rows_with_nothing_left():
    logits = torch.tensor([[0.0, -float("inf")], [-float("inf"), -float("inf")], [-float("inf"), -float("inf")]])
    assert rows_left_empty(logits, torch.tensor([0, 1])).tolist() == [False, True, False]


def bitmask_allowing(allowed: list[list[int]], vocab: int = VOCAB) -> torch.Tensor:
    bits = np.zeros((len(allowed), ((vocab + 31) // 32) * 32), dtype=np.uint8)
    for row, tokens in enumerate(allowed):
        bits[row, tokens] = 1
    return torch.from_numpy(np.packbits(bits, axis=1, bitorder="little").view(np.int32).copy())


def constrained_batch(temperatures: list[float]) -> SamplingBatch:
    batch = SamplingBatch(len(temperatures), VOCAB, 64, DEVICE)
    for row, temperature in enumerate(temperatures):
        batch.add_request(row, SamplingParams(temperature=temperature, seed=row, structured_outputs={"regex": "a"}), [1])
    return batch


@PATHS
def test_sampled_tokens_stay_in_the_allowed_set_and_a_dead_row_emits_nothing(use_triton):
    allowed = [[3, 50, 99], [7], [], [1, 2, 3, 4, 5]]
    batch = constrained_batch([1.0, 1.0, 1.0, 0.0])
    grammar = GrammarMask(bitmask_allowing(allowed).to(DEVICE), torch.arange(4, device=DEVICE))
    for _ in range(20):
        before = batch.output_pos.clone()
        out = Sampler(use_triton=use_triton)(torch.randn(4, VOCAB, device=DEVICE), torch.arange(4, device=DEVICE), batch, grammar)
        tokens = out.sampled_token_ids.tolist()
        assert tokens[0] in allowed[0] and tokens[1] == 7 and tokens[2] == -1 and tokens[3] in allowed[3]
        assert (batch.output_pos - before).tolist() == [1, 1, 0, 1]


@PATHS
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_verification_rows_use_their_own_masks_and_a_dead_row_ends_the_request(use_triton, temperature):
    """Two requests of two rows: the first's draft is allowed at row 0, its row 1 is dead; the second's
    draft is forbidden, and its row 0 allows only 11 (the row's draw), its row 1 only 13."""
    batch = constrained_batch([temperature, temperature])
    logits = torch.zeros(4, VOCAB, device=DEVICE)
    logits[:, 10] = 5.0  # the unconstrained argmax
    grammar = GrammarMask(bitmask_allowing([[10], [], [11], [13]]).to(DEVICE), torch.arange(4, device=DEVICE))
    drafts = torch.tensor([10, -1, 10, -1], device=DEVICE)
    rows, offsets = torch.tensor([0, 1], device=DEVICE), torch.tensor([0, 2, 4], device=DEVICE)
    out = Sampler(use_triton=use_triton).verify(logits, rows, drafts, offsets, batch, grammar)
    assert out.token_ids.tolist() == [10, -1, 11, -1]
    assert out.num_emitted.tolist() == [2, 1]
    assert batch.output_pos.tolist() == [1, 1]
