"""`Sampler.verify` is exact: the emitted tokens are distributed as non-speculative sampling's (chi-square, fixed seeds)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sampling_helpers import assert_matches, assert_same_distribution, char_encode, fixed_logits, reference_probs, verify_layout

from sampling.batch import SamplingBatch
from sampling.params import SamplingParams
from sampling.sampler import Sampler
from sampling.tokenized import tokenize_strings

DRAWS = 20_000


def make_batch(params: list[SamplingParams], vocab: int, prompt: list[int], max_model_len: int = 64) -> SamplingBatch:
    batch = SamplingBatch(len(params), vocab, max_model_len, "cpu", eos_token_ids=(vocab - 1,))
    for row, p in enumerate(params):
        batch.add_request(row, p, prompt, tokenize_strings(p, char_encode(vocab)))
    return batch


def half_seeded(params: SamplingParams, first_seed: int = 0) -> list[SamplingParams]:
    return [params.model_copy(update={"seed": first_seed + i if i % 2 else None}) for i in range(DRAWS)]


@pytest.mark.parametrize("draft", ["high", "low", "zero"])
def test_one_position_with_a_point_mass_draft(draft: str) -> None:
    """The first emitted token follows p_0 whatever the draft; after an accepted draft the bonus token follows p_1."""
    torch.manual_seed(0)
    vocab, config = 24, dict(temperature=0.8, top_p=0.9)
    first, second = fixed_logits(vocab, seed=3), fixed_logits(vocab, seed=4)
    p0 = reference_probs(first.numpy(), **config)
    support = np.flatnonzero(p0 > 0)
    token = {"high": p0.argmax(), "low": support[p0[support].argmin()], "zero": np.flatnonzero(p0 == 0)[0]}[draft]
    logits = torch.stack([first, second]).repeat(DRAWS, 1)
    draft_ids, cu = verify_layout([[int(token)]] * DRAWS)
    batch = make_batch(half_seeded(SamplingParams(**config)), vocab, [0])
    out = Sampler().verify(logits, torch.arange(DRAWS), draft_ids, cu, batch)
    emitted = out.token_ids.view(DRAWS, 2).numpy()
    assert_matches(emitted[:, 0], p0)
    accepted = emitted[:, 0] == token
    assert (out.num_emitted.numpy() == 1 + accepted).all()
    assert (emitted[~accepted, 1] == -1).all()
    if accepted.sum() >= 200:
        assert_matches(emitted[accepted, 1], reference_probs(second.numpy(), **config))


VOCAB = 6
PROMPT = [0, 1, 0]
POSITIONS = 3
JOINT_CONFIGS = {
    "penalties_top_p": SamplingParams(repetition_penalty=1.4, frequency_penalty=0.6, presence_penalty=0.3, top_p=0.8, temperature=0.9),
    "bad_word_min_tokens_top_k": SamplingParams(bad_words=["ab"], min_tokens=2, top_k=4, temperature=1.2),
}
"""History-dependent transforms. "ab" encodes to (1, 2): token 2 is banned right after 1; EOS (5) before 2 outputs.
(DRY with drafts is checked exactly, row by row, in test_rejection.py.)"""


class ToyModel:
    """Next-token logits that depend on the last token, so drafts change the target rows too."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(11)
        self.base = torch.randn(VOCAB, generator=g)
        self.transition = torch.randn(VOCAB, VOCAB, generator=g) * 1.5

    def logits(self, last: torch.Tensor) -> torch.Tensor:
        return self.base + self.transition[last]


def sequential(model: ToyModel, params: SamplingParams) -> np.ndarray:
    """[DRAWS, POSITIONS] tokens from plain `__call__` steps."""
    torch.manual_seed(1)
    batch = make_batch(half_seeded(params, first_seed=10**6), VOCAB, PROMPT, max_model_len=16)
    rows, last, tokens = torch.arange(DRAWS), torch.full((DRAWS,), PROMPT[-1]), []
    for _ in range(POSITIONS):
        last = Sampler()(model.logits(last), rows, batch).sampled_token_ids
        tokens.append(last)
    return torch.stack(tokens, dim=1).numpy()


def speculative(model: ToyModel, params: SamplingParams) -> np.ndarray:
    """[DRAWS, POSITIONS] tokens from verify steps with 0-3 drafts per request (the argmax chain or random tokens)."""
    torch.manual_seed(2)
    g = torch.Generator().manual_seed(3)
    batch = make_batch(half_seeded(params), VOCAB, PROMPT, max_model_len=16)
    rows, last = torch.arange(DRAWS), torch.full((DRAWS,), PROMPT[-1])
    tokens, count = torch.full((DRAWS, 4 * POSITIONS), -1), torch.zeros(DRAWS, dtype=torch.int64)
    for _ in range(POSITIONS):  # each step emits at least one token
        k = torch.randint(0, 4, (DRAWS,), generator=g)
        chain, previous = [], last
        for _ in range(3):
            greedy = model.logits(previous).argmax(dim=-1)
            previous = torch.where(torch.rand(DRAWS, generator=g) < 0.5, greedy, torch.randint(0, VOCAB, (DRAWS,), generator=g))
            chain.append(previous)
        drafts = [chain_i[:k_i] for chain_i, k_i in zip(torch.stack(chain, dim=1).tolist(), k.tolist())]
        draft_ids, cu = verify_layout(drafts)
        request = torch.repeat_interleave(rows, k + 1)
        offset = torch.arange(len(draft_ids)) - cu[request]
        row_last = torch.where(offset == 0, last[request], draft_ids.roll(1))
        out = Sampler().verify(model.logits(row_last), rows, draft_ids, cu, batch)
        emitted = out.token_ids >= 0
        tokens[request[emitted], count[request[emitted]] + offset[emitted]] = out.token_ids[emitted]
        count += out.num_emitted
        last = tokens[rows, count - 1]
    assert (count >= POSITIONS).all()
    return tokens[:, :POSITIONS].numpy()


@pytest.mark.parametrize("name", list(JOINT_CONFIGS))
def test_joint_distribution_of_three_positions_matches_sequential_sampling(name: str) -> None:
    model, params = ToyModel(), JOINT_CONFIGS[name]
    cells = VOCAB**POSITIONS
    to_cell = VOCAB ** np.arange(POSITIONS - 1, -1, -1)
    expected, got = sequential(model, params) @ to_cell, speculative(model, params) @ to_cell
    assert len(np.unique(expected)) > 20  # a joint distribution with many sequences, not a point mass
    assert_same_distribution(got, expected, cells)
