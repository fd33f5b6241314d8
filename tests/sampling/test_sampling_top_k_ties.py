"""Top-k with a tie at the boundary that runs past the first candidate set, on both paths (issue 13).

``top_k=250`` with 20 tokens tied at places 249..268: all 20 are kept (as the docstrings,
vLLM and llama.cpp's sort do), though the torch path first examines only 256 candidates.
"""

from __future__ import annotations

import pytest
import torch
from sampling_helpers import DEVICE, assert_matches, batch_of, reference_probs

from sampling.params import SamplingParams
from sampling.sampler import Sampler

VOCAB = 512
DRAWS = 20_000
TOP_K = 250
ABOVE_THE_TIE = 248
TIED = 20


def tied_logits() -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [V], the tied ids [20]): 248 distinct logits, then 20 equal ones, then lower ones, ids shuffled."""
    ordered = torch.cat([
        torch.linspace(1.5, 0.6, ABOVE_THE_TIE),
        torch.full((TIED,), 0.5),
        torch.linspace(-1.0, -4.0, VOCAB - ABOVE_THE_TIE - TIED),
    ])  # fmt: skip
    ids = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(21))
    logits = torch.empty(VOCAB).scatter_(0, ids, ordered)
    return logits, ids[ABOVE_THE_TIE : ABOVE_THE_TIE + TIED]


@pytest.mark.parametrize("use_triton", [False, True], ids=["torch", "triton"])
def test_every_tie_at_the_kth_place_is_drawn_with_its_probability(use_triton: bool) -> None:
    """20,000 draws (half seeded, distinct seeds) against the float64 target: chi-square, alpha 1e-3."""
    torch.manual_seed(22)
    logits, tied = tied_logits()
    params = [SamplingParams(top_k=TOP_K, seed=i if i % 2 else None) for i in range(DRAWS)]
    batch = batch_of(params, VOCAB, device=DEVICE)
    drawn = Sampler(use_triton=use_triton)(logits.to(DEVICE).expand(DRAWS, -1), torch.arange(DRAWS, device=DEVICE), batch)
    tokens = drawn.sampled_token_ids.cpu()
    expected = reference_probs(logits.double().numpy(), top_k=TOP_K)
    assert (expected > 0).sum() == ABOVE_THE_TIE + TIED and (expected[tied.numpy()] > 0).all()
    assert set(tied.tolist()) <= set(tokens.tolist())
    assert_matches(tokens.numpy(), expected)
