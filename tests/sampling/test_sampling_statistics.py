"""Statistical correctness of the torch path: 20,000 draws against an independent float64 target."""

from __future__ import annotations

import pytest
import torch
from sampling_helpers import TRUNCATION_CONFIGS, assert_matches, batch_of, fixed_logits, reference_probs

from sampling.params import SamplingParams
from sampling.sampler import Sampler

DRAWS = 20_000
VOCAB = 48

CONFIGS = TRUNCATION_CONFIGS


def draw_many(params: SamplingParams, logits: torch.Tensor, sampler: Sampler, prompt: list[int] | None = None) -> torch.Tensor:
    """DRAWS draws of one distribution: half the rows seeded (distinct seeds), half unseeded."""
    rows = [params.model_copy(update={"seed": i if i % 2 else None}) for i in range(DRAWS)]
    batch = batch_of(rows, logits.shape[-1], prompt=prompt)
    return sampler(logits.expand(DRAWS, -1), torch.arange(DRAWS), batch).sampled_token_ids


@pytest.mark.parametrize("widths", [(256,), (8,)], ids=["full-sort", "candidates-8"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_truncation_distribution(name: str, widths: tuple[int, ...]) -> None:
    torch.manual_seed(1)
    config = CONFIGS[name]
    logits = fixed_logits(VOCAB, seed=3)
    samples = draw_many(SamplingParams(**config), logits, Sampler(candidate_widths=widths))
    assert_matches(samples.numpy(), reference_probs(logits.numpy(), **config))


def test_penalties_with_top_p() -> None:
    """Repetition on prompt tokens, presence/frequency on recorded outputs, then top-p."""
    torch.manual_seed(2)
    logits = fixed_logits(VOCAB, seed=4)
    params = SamplingParams(top_p=0.9, repetition_penalty=1.5, presence_penalty=0.7, frequency_penalty=0.4)
    prompt = [0, 1, 2, 3]
    rows = [params.model_copy(update={"seed": i if i % 2 else None}) for i in range(DRAWS)]
    batch = batch_of(rows, VOCAB, prompt=prompt)
    all_rows = torch.arange(DRAWS)
    for token in (3, 4, 4):  # outputs so far: 3 once, 4 twice
        batch.record(all_rows, torch.full((DRAWS,), token))
    samples = Sampler(candidate_widths=(8,))(logits.expand(DRAWS, -1), all_rows, batch).sampled_token_ids
    z = logits.double().numpy().copy()
    for t in {0, 1, 2, 3, 4}:
        z[t] = z[t] / 1.5 if z[t] > 0 else z[t] * 1.5
    z[3] -= 0.7 + 0.4
    z[4] -= 0.7 + 0.8
    assert_matches(samples.numpy(), reference_probs(z, top_p=0.9))


@pytest.mark.parametrize("widths", [(256,), (8,)], ids=["full-sort", "candidates-8"])
def test_top_k_keeps_every_tie_beyond_the_candidate_set(widths: tuple[int, ...]) -> None:
    """Ten tokens tie with the 6th largest logit at places 5..14: all ten are kept, also when the
    candidate set (8 wide) holds only some of them."""
    torch.manual_seed(4)
    logits = torch.full((VOCAB,), -3.0)
    logits[:4] = torch.tensor([2.0, 1.5, 1.2, 1.0])
    logits[20:30] = 0.5  # away from the first columns, so ids do not give the order away
    config = dict(top_k=6)
    samples = draw_many(SamplingParams(**config), logits, Sampler(candidate_widths=widths))
    expected = reference_probs(logits.numpy(), **config)
    assert (expected[20:30] > 0).all() and (expected[30:] == 0).all()
    assert_matches(samples.numpy(), expected)
