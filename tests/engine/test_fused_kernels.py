"""One set of fused kernels per device type (`engine.models.fused_kernels`): where the CPU and CUDA
both have a kernel, it takes the same arguments, so a layer calls either the same way; the kernels
only CUDA has are None on the CPU, where the layers run torch's operations."""

from __future__ import annotations

import inspect

import pytest
import torch

from engine.models import fused_kernels
from engine.models.fused_kernels import FusedKernels, for_device_type
from engine.models.llama import RMSNorm, silu_mul


def parameters(function) -> list[tuple[str, object]]:  # noqa: ANN001 - any kernel
    return [(p.name, p.kind) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize("name", ["rope_and_write_cache", "paged_decode_attention"])
def test_the_cpu_and_cuda_kernels_take_the_same_arguments(name):
    cpu, cuda = getattr(for_device_type("cpu"), name), getattr(for_device_type("cuda"), name)
    assert cpu is not cuda
    assert parameters(cpu) == parameters(cuda)


def test_the_kernels_only_cuda_has_are_none_on_the_cpu_where_torch_runs():
    cpu, cuda = for_device_type("cpu"), for_device_type("cuda")
    assert cpu.add_rms_norm is None and cpu.silu_mul is None
    assert [name for name, _ in parameters(cuda.add_rms_norm)] == ["x", "delta", "weight", "eps"]
    assert [name for name, _ in parameters(cuda.silu_mul)] == ["gate", "up"]
    gate, up = torch.randn(3, 8), torch.randn(3, 8)
    assert torch.equal(silu_mul(gate, up), torch.nn.functional.silu(gate) * up)
    norm = RMSNorm(8, 1e-6)
    total, normed = norm.add_and_norm(gate, up)
    assert torch.equal(total, gate + up) and torch.equal(normed, norm(gate + up))


def test_each_device_types_set_is_made_once():
    assert for_device_type("cpu") is for_device_type("cpu")
    assert isinstance(fused_kernels.for_device_type("cuda"), FusedKernels)
