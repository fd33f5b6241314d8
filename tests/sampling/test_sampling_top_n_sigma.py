"""Top-nσ over heavily biased and underflowing logits, on both paths (issue 13).

The mean and std are taken over every kept finite logit, also where the float32 weight
``exp(logit - max)`` underflows to 0 (a logit_bias of -100, a low temperature): the kept
set equals the float64 definition and the draws follow the float64 target.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sampling_helpers import DEVICE, assert_matches, batch_of, reference_probs

from sampling.features import Feature
from sampling.ops import top_tokens
from sampling.ops.truncation import apply_truncations, top_candidates
from sampling.params import SamplingParams
from sampling.sampler import Sampler
from sampling.triton import triton_sample
from sampling.view import RowView

VOCAB = 1000
DRAWS = 20_000
STAGES = frozenset({Feature.TOP_N_SIGMA})
PATHS = pytest.mark.parametrize("use_triton", [False, True], ids=["torch", "triton"])


def biased_logits() -> tuple[torch.Tensor, dict[int, float]]:
    """Normal logits with a logit_bias of -100 on the least likely fifth of the vocabulary: their
    weights underflow to 0 even as float32 subnormals (on CUDA, which flushes subnormals, sooner)."""
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(11)) * 2
    return logits, {int(token): -100.0 for token in logits.argsort()[: VOCAB // 5]}


def cluster_logits() -> torch.Tensor:
    """Ten close top logits and a far tail: at temperature 0.01 the tail's weights all underflow to 0."""
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(12)) * 2 - 10
    logits[100:1000:90] = -0.005 * torch.arange(10, dtype=torch.float32)  # spread out, ids do not give the order
    return logits


TEMPERATURES = {"bias-100": 1.0, "temperature-0.01": 0.01}
WIDE_N_SIGMA = {"bias-100": 2.65, "temperature-0.01": 2.5}
"""Per case, an n that keeps some tokens whose float32 weight is 0 (and not all tokens)."""


def case_logits(name: str) -> tuple[torch.Tensor, dict[int, float]]:
    """(raw logits [V], logit_bias) of a case."""
    return biased_logits() if name == "bias-100" else (cluster_logits(), {})


def biased(logits: torch.Tensor, bias: dict[int, float]) -> torch.Tensor:
    out = logits.clone()
    out[list(bias)] += torch.tensor(list(bias.values()))
    return out


def kept_by_definition(scaled: np.ndarray, n_sigma: float) -> np.ndarray:
    """[V] bool in float64: logit >= max - n * std over every finite logit (population std)."""
    z = scaled.astype(np.float64)
    threshold = z.max() - n_sigma * z.std()
    assert np.abs(z - threshold).min() > 1e-4 * max(1.0, z.std()), "a logit too close to the threshold to compare"
    return z >= threshold


def kept_by_path(scaled: torch.Tensor, params: SamplingParams, use_triton: bool) -> np.ndarray:
    """[V] bool: the kept set of one row on the Triton kernel or the torch path (full sort)."""
    if use_triton:
        p = RowView.of(batch_of([params], VOCAB, device=DEVICE), torch.tensor([0], device=DEVICE)).params
        keys = torch.zeros(1, dtype=torch.int64, device=DEVICE)
        processed = triton_sample(scaled[None].to(DEVICE), p, keys, STAGES, need_processed=True, drafts=None).processed
        return (processed[0] > float("-inf")).cpu().numpy()
    p = RowView.of(batch_of([params], VOCAB), torch.tensor([0])).params
    c = top_candidates(top_tokens.scaled_logits(scaled[None], torch.ones(1), None), VOCAB)
    apply_truncations(c, p, STAGES, torch.zeros(1))
    return torch.zeros(VOCAB, dtype=torch.bool).scatter_(0, c.ids[0], c.keep[0]).numpy()


def scaled_logits(name: str) -> torch.Tensor:
    """[V] the case's logits after logit_bias and temperature."""
    logits, bias = case_logits(name)
    return biased(logits, bias) / TEMPERATURES[name]


@PATHS
@pytest.mark.parametrize("wide", [False, True], ids=["n=1", "n=wide"])
@pytest.mark.parametrize("name", list(TEMPERATURES))
def test_kept_set_is_the_definition(name: str, wide: bool, use_triton: bool) -> None:
    n_sigma = WIDE_N_SIGMA[name] if wide else 1.0
    scaled = scaled_logits(name)
    expected = kept_by_definition(scaled.numpy(), n_sigma)
    assert 1 < expected.sum() < VOCAB
    ours = kept_by_path(scaled, SamplingParams(top_n_sigma=n_sigma), use_triton)
    assert np.array_equal(ours, expected), f"kept {ours.sum()}, definition {expected.sum()}"


@pytest.mark.parametrize("name", list(TEMPERATURES))
def test_the_wide_n_keeps_underflowed_tokens(name: str) -> None:
    """The cases do what they claim: the definition keeps tokens whose float32 weight is 0."""
    scaled = scaled_logits(name)
    weights = torch.exp(scaled - scaled.max()).numpy()
    assert (kept_by_definition(scaled.numpy(), WIDE_N_SIGMA[name]) & (weights == 0)).any()


@PATHS
@pytest.mark.parametrize("name", list(TEMPERATURES))
def test_draws_follow_the_float64_target(name: str, use_triton: bool) -> None:
    """20,000 draws (half seeded, distinct seeds) against the float64 target: chi-square, alpha 1e-3."""
    torch.manual_seed(13)
    logits, bias = case_logits(name)
    temperature = TEMPERATURES[name]
    params = [SamplingParams(top_n_sigma=1.0, temperature=temperature, logit_bias=bias, seed=i if i % 2 else None)
              for i in range(DRAWS)]  # fmt: skip
    batch = batch_of(params, VOCAB, device=DEVICE)
    rows = torch.arange(DRAWS, device=DEVICE)
    drawn = Sampler(use_triton=use_triton)(logits.to(DEVICE).expand(DRAWS, -1), rows, batch).sampled_token_ids.cpu()
    expected = reference_probs(biased(logits, bias).double().numpy(), temperature=temperature, top_n_sigma=1.0)
    assert (expected > 0.01).sum() >= 3  # several tokens with real mass: a narrower kept set shows
    assert_matches(drawn.numpy(), expected)
