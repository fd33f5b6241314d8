"""The top-set kernel draws from the exact truncated distribution where its rejections and radix select do the
work: flat logits (the race's first winner is often outside the kept set) against the float64 sort-based target."""

from __future__ import annotations

import pytest
import torch
from sampling_helpers import assert_matches, fixed_logits, reference_probs
from top_set_helpers import run_top_set

from sampling.params import SamplingParams

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DRAWS = 6000
VOCAB = 400
CONFIGS = {
    "small_top_k": dict(top_k=3),
    "small_top_p": dict(top_p=0.05),
    "top_k_top_p_undecided": dict(top_k=12, top_p=0.5),
    "min_p_top_k_top_p": dict(min_p=0.3, top_k=40, top_p=0.7, temperature=0.8),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_flat_rows_match_the_target(name: str) -> None:
    """Half the rows seeded, half unseeded (keys from torch's generator, seeded here); chi-square at alpha 1e-3."""
    torch.manual_seed(11)
    config = CONFIGS[name]
    logits = fixed_logits(VOCAB, seed=12, scale=0.4)
    params = [SamplingParams(**config, seed=i if i % 2 else None) for i in range(DRAWS)]
    drawn = run_top_set(params, logits.expand(DRAWS, -1).contiguous().to(DEVICE))
    assert_matches(drawn.token_ids.cpu().numpy(), reference_probs(logits.numpy(), **config))
