"""Triton SiLU-and-multiply kernel: an MLP's ``silu(gate) * up`` in one launch (CUDA).

torch computes it as two element-wise kernels, the first writing ``silu(gate)`` out and the second
reading it back: at batch 256 of a Llama-3-8B shape each is a 7 MB pass over [256, 14,336], and
together they took 0.87 ms of an 11 ms step on an H200. Here each element is read once and its
product written once. The arithmetic is torch's (SiLU in float32 rounded to the activations'
dtype, then the product in float32 rounded again), up to the GPU's ``exp``. Import this module only
when the kernel is needed: ``TRITON_INTERPRET`` is read when the kernel is decorated, so tests set it
before the first import.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024
"""Columns a program computes."""


@triton.jit
def silu_mul_kernel(gate_ptr, up_ptr, out_ptr, stride_gate, stride_up, size, BLOCK: tl.constexpr):
    """Program (row, column block): out[row] = silu(gate[row]) * up[row] over BLOCK columns (rows any stride apart)."""
    row = tl.program_id(0)
    columns = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = columns < size
    gate = tl.load(gate_ptr + row * stride_gate + columns, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + row * stride_up + columns, mask=mask, other=0.0)
    activated = (gate / (1.0 + tl.exp(-gate))).to(up.dtype)
    tl.store(out_ptr + row * size + columns, (activated.to(tl.float32) * up.to(tl.float32)).to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate, up: [T, I] (each row contiguous: column views of a merged projection) -> silu(gate) * up [T, I]."""
    num_rows, size = gate.shape
    assert gate.stride(1) == 1 and up.stride(1) == 1, "each row is contiguous"
    out = torch.empty(num_rows, size, dtype=gate.dtype, device=gate.device)
    silu_mul_kernel[(num_rows, triton.cdiv(size, BLOCK))](gate, up, out, gate.stride(0), up.stride(0), size, BLOCK=BLOCK)
    return out
