"""The C++ RMS-norm kernel against torch's float32 ``F.rms_norm``, bit for bit, its refusals, and the
engine's norms running through it on the CPU in float32."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.kernels import rms_norm
from engine.loader.checkpoint import random_checkpoint
from engine.loader.random_shapes import TINY_RANDOM
from engine.model_runner import ModelRunner
from engine.models.llama import RMSNorm

pytestmark = pytest.mark.skipif(rms_norm.load() is None, reason="the kernel cannot be built here (no C++ compiler)")


@settings(max_examples=60, deadline=None)
@given(
    # Up to 512 groups of 32: ATen's cascade folds its accumulators at 16 and 256 groups.
    groups=st.one_of(st.integers(1, 40), st.sampled_from([18, 64, 255, 256, 257, 300, 512])),
    num_tokens=st.integers(1, 40),
    magnitude=st.sampled_from([1e-4, 1.0, 1e3]),
    eps=st.sampled_from([1e-6, 1e-5, 0.5]),
    seed=st.integers(0, 1000),
)
def test_kernel_is_torch_bit_for_bit(groups, num_tokens, magnitude, eps, seed):
    generator = torch.Generator().manual_seed(seed)
    size = groups * rms_norm.ROW_MULTIPLE
    # Rows of unequal scale, so that each row's sum carries its own rounding.
    x = torch.randn(num_tokens, size, generator=generator) * magnitude * torch.rand(num_tokens, 1, generator=generator).add(0.01)
    weight = torch.randn(size, generator=generator)
    assert torch.equal(rms_norm.rms_norm(x, weight, eps), F.rms_norm(x, [size], weight, eps))


def test_a_row_is_the_same_alone_and_in_a_batch():
    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(64, 576, generator=generator), torch.randn(576, generator=generator)
    batch = rms_norm.rms_norm(x, weight, 1e-5)
    for row in (0, 17, 63):
        assert torch.equal(rms_norm.rms_norm(x[row : row + 1], weight, 1e-5)[0], batch[row])


@pytest.mark.parametrize(
    ("x", "weight", "message"),
    [
        (torch.zeros(2, 48), torch.ones(48), "multiple of 32"),
        (torch.zeros(2, 64), torch.ones(32), "weight must be"),
        (torch.zeros(2, 64, dtype=torch.float64), torch.ones(64), "x must be"),
        (torch.zeros(64), torch.ones(64), "x must be"),
        (torch.zeros(2, 64), torch.ones(64, dtype=torch.float64), "weight must be"),
    ],
)
def test_bad_arguments_are_refused(x, weight, message):
    with pytest.raises(RuntimeError, match=message):
        rms_norm.load().rms_norm(x, weight, 1e-5)


def test_the_float32_cpu_engine_normalizes_through_the_kernel():
    config = EngineConfig(model=TINY_RANDOM, max_num_seqs=2, max_model_len=64)
    runner = ModelRunner(random_checkpoint(TINY_RANDOM), config, eos_token_ids=())
    norms = [module for module in runner.model.modules() if isinstance(module, RMSNorm)]
    assert norms and all(norm.kernel for norm in norms)
    hidden = torch.randn(3, norms[0].weight.shape[0])
    kernel_out = norms[0](hidden)
    norms[0].kernel = False
    assert torch.equal(kernel_out, norms[0](hidden))


def test_the_kernel_is_used_only_where_it_gives_torchs_bits(monkeypatch):
    rms_norm.matches_torch.cache_clear()
    assert rms_norm.can_fuse(torch.device("cpu"), torch.float32, 576)
    rms_norm.matches_torch.cache_clear()
    monkeypatch.setattr(rms_norm, "rms_norm", lambda x, weight, eps: F.rms_norm(x, [x.shape[1]], weight, eps) * 1.0000001)
    assert not rms_norm.can_fuse(torch.device("cpu"), torch.float32, 576)
    rms_norm.matches_torch.cache_clear()
