"""The decoder's layers against their formulas written out in torch ops."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.models.llama import RMSNorm


def written_out_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [T, hidden] -> [T, hidden], in float32 whatever x's dtype, as the HF Llama computes it."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight.float()).to(x.dtype)


@settings(max_examples=40)
@given(
    tokens=st.integers(1, 300),
    hidden=st.sampled_from([64, 576, 960, 4096]),
    magnitude=st.floats(1e-3, 1e3),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**31 - 1),
)
def test_rms_norm_is_the_written_out_formula_bit_for_bit(tokens, hidden, magnitude, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    norm = RMSNorm(hidden, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(hidden, generator=generator))
    norm = norm.to(dtype)
    x = (torch.randn(tokens, hidden, generator=generator) * magnitude).to(dtype)
    with torch.inference_mode():
        assert torch.equal(norm(x), written_out_rms_norm(x, norm.weight, norm.eps))
