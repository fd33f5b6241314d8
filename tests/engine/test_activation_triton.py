"""The Triton SiLU-and-multiply kernel (the interpreter on the CPU) against torch's ``silu(gate) * up``,
and the engine's tokens with it."""

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
@pytest.mark.parametrize("size", [64, 1536, 3000])  # 3000: a partial last block
def test_kernel_matches_torch(size: int, dtype: torch.dtype) -> None:
    from engine.models.activation_triton import silu_mul

    generator = torch.Generator().manual_seed(size)
    merged = (torch.randn(3, 2 * size, generator=generator) * 4).to(DEVICE, dtype)
    gate, up = merged[:, :size], merged[:, size:]  # column views of a merged gate/up projection
    tolerance = {torch.float32: 1e-6, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(silu_mul(gate, up), F.silu(gate) * up, rtol=tolerance, atol=tolerance)


def test_engine_with_the_kernel_gives_the_pre_paging_tokens(tiny_checkpoint, monkeypatch):
    from engine.models import activation_triton, llama

    calls = []

    def counted(gate, up):
        calls.append(gate.shape[0])
        return activation_triton.silu_mul(gate, up)

    monkeypatch.setattr(llama, "silu_mul", counted)  # the Triton kernel on the CPU too
    _, outputs = run_mixed(tiny_checkpoint)
    assert outputs == PRE_PAGING_TOKENS
    assert max(calls) > 1


def test_kernel_compiles_for_sm90() -> None:
    signature = {"gate_ptr": "*bf16", "up_ptr": "*bf16", "out_ptr": "*bf16", "stride_gate": "i64", "stride_up": "i64", "size": "i32"}
    assert_compiles_for_sm90("engine.models.activation_triton", "silu_mul_kernel", signature, {"BLOCK": 1024})
