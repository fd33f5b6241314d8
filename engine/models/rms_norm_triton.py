"""Triton residual-add-and-RMSNorm kernel: ``s = x + delta`` and ``rms_norm(s)`` in one launch (CUDA).

Each decoder layer adds its attention's and its MLP's outputs to the residual stream and normalizes
the sum for what comes next: two launches by torch (the add, then the norm) for every one here,
at batch 1 some 60 of a step's few hundred few-microsecond kernels. The sum is torch's (float32
addition rounded to the stream's dtype); the norm computes in float32 as torch's fused
``rms_norm`` does, up to the order of its sum of squares. Import this module only when the kernel
is needed: ``TRITON_INTERPRET`` is read when the kernel is decorated, so tests set it before the first import.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def add_rms_norm_kernel(x_ptr, delta_ptr, weight_ptr, sum_ptr, out_ptr, stride_x, stride_delta, size, eps, BLOCK: tl.constexpr):
    """Program (row): sum and normed row of x, delta [T, size] (rows any stride apart) into sum, out [T, size] (contiguous)."""
    row = tl.program_id(0)
    columns = tl.arange(0, BLOCK)
    mask = columns < size
    x = tl.load(x_ptr + row * stride_x + columns, mask=mask, other=0.0)
    delta = tl.load(delta_ptr + row * stride_delta + columns, mask=mask, other=0.0)
    total = (x.to(tl.float32) + delta.to(tl.float32)).to(sum_ptr.dtype.element_ty)
    tl.store(sum_ptr + row * size + columns, total, mask=mask)
    values = total.to(tl.float32)
    inverse_rms = 1.0 / tl.sqrt(tl.sum(values * values, axis=0) / size + eps)
    weight = tl.load(weight_ptr + columns, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * size + columns, (values * inverse_rms * weight).to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x, delta: [T, size] (each row contiguous), weight: [size] -> (x + delta, rms_norm(x + delta) * weight), each [T, size]."""
    num_rows, size = x.shape
    assert x.stride(1) == 1 and delta.stride(1) == 1, "each row is contiguous"
    total, out = torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(x, memory_format=torch.contiguous_format)
    block = triton.next_power_of_2(size)
    add_rms_norm_kernel[(num_rows,)](
        x, delta, weight, total, out, x.stride(0), delta.stride(0), size, eps, BLOCK=block, num_warps=min(16, max(1, block // 256))
    )
    return total, out
