"""The sort-free row statistics of the torch path against torch's own reductions, ties included."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sampling.ops.top_tokens import block_maxima, first_argmax, logsumexp_rows, top_logits


@st.composite
def logits_rows(draw: st.DrawFn) -> torch.Tensor:
    """[n, V] logits: continuous, or drawn from a few levels (many ties), with some -inf."""
    n, vocab = draw(st.integers(1, 9)), draw(st.sampled_from([7, 40, 48, 300, 1000, 4096]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    logits = torch.randn(n, vocab, generator=g) * 3
    if draw(st.booleans()):
        logits = logits.round().clamp(-2, 2)
    return logits.masked_fill(torch.rand(n, vocab, generator=g) < draw(st.sampled_from([0.0, 0.5])), float("-inf"))


@given(logits_rows(), st.sampled_from([1, 2, 5, 16, 64, 200]))
@settings(max_examples=60, deadline=None)
def test_top_logits_are_the_largest(logits: torch.Tensor, width: int) -> None:
    width = min(width, logits.shape[1] - 1)
    values, ids = top_logits(logits, block_maxima(logits), width)
    assert torch.equal(values, logits.topk(width, dim=-1).values)
    assert torch.equal(logits.gather(1, ids), values)
    assert all(len(set(row)) == width for row in ids.tolist())


@given(logits_rows())
@settings(max_examples=60, deadline=None)
def test_first_argmax_is_the_first_maximum(logits: torch.Tensor) -> None:
    expected = [row.index(max(row)) for row in logits.tolist()]
    assert first_argmax(logits, block_maxima(logits)).tolist() == expected


@given(logits_rows(), st.floats(0.1, 3.0))
@settings(max_examples=30, deadline=None)
def test_logsumexp_rows(logits: torch.Tensor, temperature: float) -> None:
    t = torch.full((logits.shape[0],), temperature)
    expected = torch.logsumexp(logits / temperature, dim=-1, keepdim=True)
    torch.testing.assert_close(logsumexp_rows(logits, t, block_maxima(logits)), expected)
