"""The Triton residual-add-and-RMSNorm kernel (the interpreter on the CPU) against torch's add and
fused ``rms_norm``, and the engine's tokens with it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.engine.mixed_workload import run_mixed
from tests.engine.test_paged_kv import PRE_PAGING_TOKENS
from tests.triton_aot import assert_compiles_for_sm90

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16] if DEVICE == "cuda" else [torch.float32]
"""bfloat16 on CUDA only: the interpreter's float32-to-bfloat16 conversion truncates (Triton 3.6)."""


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("size", [64, 576, 4096, 100])  # 100: a width that is no power of two
def test_kernel_matches_torchs_add_and_norm(size: int, dtype: torch.dtype) -> None:
    from engine.models.rms_norm_triton import add_rms_norm

    generator = torch.Generator().manual_seed(size)
    x = (torch.randn(5, size, generator=generator) * 3).to(DEVICE, dtype)
    wide = torch.randn(5, 2 * size, generator=generator).to(DEVICE, dtype)
    delta = wide[:, :size]  # a column view: rows further apart than their width
    weight = (torch.rand(size, generator=generator) + 0.5).to(DEVICE, dtype)
    total, normed = add_rms_norm(x, delta, weight, 1e-5)
    expected_total = x + delta
    assert torch.equal(total, expected_total)
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(normed, F.rms_norm(expected_total, (size,), weight, 1e-5), rtol=tolerance, atol=tolerance)


def test_engine_with_the_kernel_gives_the_pre_paging_tokens(tiny_checkpoint, monkeypatch):
    from engine.models import rms_norm_triton
    from engine.models.llama import RMSNorm

    calls = []

    def with_kernel(norm, x, delta):
        calls.append(x.shape[0])
        return rms_norm_triton.add_rms_norm(x, delta, norm.weight, norm.eps)

    monkeypatch.setattr(RMSNorm, "add_and_norm", with_kernel)  # the Triton kernel on the CPU too
    _, outputs = run_mixed(tiny_checkpoint)
    assert outputs == PRE_PAGING_TOKENS
    assert max(calls) > 1


def test_kernel_compiles_for_sm90() -> None:
    signature = {name: "*bf16" for name in ("x_ptr", "delta_ptr", "weight_ptr", "sum_ptr", "out_ptr")}
    signature |= {"stride_x": "i64", "stride_delta": "i64", "size": "i32", "eps": "fp32"}
    assert_compiles_for_sm90("engine.models.rms_norm_triton", "add_rms_norm_kernel", signature, {"BLOCK": 4096})
