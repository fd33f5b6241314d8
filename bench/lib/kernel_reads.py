"""Count what interpreted Triton kernels read from one tensor: the measured pass count of a kernel.

Under ``TRITON_INTERPRET=1`` every ``tl.load`` goes through the interpreter's builder with the
addresses it reads and its mask. `counting_reads` wraps that call and counts, per row of a
[B, V] tensor, the elements that the kernel loaded from it (masked-off lanes are not read), so
a kernel's passes over [B, V] are counted from what it did, not from what it declares.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class Reads:
    """Elements loaded from each row of a [B, V] tensor."""

    shape: tuple[int, int]
    per_row: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.per_row = np.zeros(self.shape[0], dtype=np.int64)

    def passes(self) -> np.ndarray:
        """[B] float: elements read per row / V."""
        return self.per_row / self.shape[1]


@contextmanager
def counting_reads(tensor: torch.Tensor) -> Iterator[Reads]:
    """Count the interpreter's loads from ``tensor`` ([B, V] float32 on the CPU, row stride >= V, unit column stride)."""
    import triton
    from triton.runtime import interpreter

    if not triton.knobs.runtime.interpret:
        raise RuntimeError("counting reads needs TRITON_INTERPRET=1 before triton is imported")
    assert tensor.dim() == 2 and tensor.stride(1) == 1 and tensor.device.type == "cpu"
    reads = Reads((tensor.shape[0], tensor.shape[1]))
    base, row_bytes = tensor.data_ptr(), tensor.stride(0) * tensor.element_size()
    end = base + row_bytes * tensor.shape[0]
    builder = interpreter.InterpreterBuilder
    original = builder.create_masked_load

    def counted(self, ptrs, mask, other, cache_policy, is_volatile):  # noqa: ANN001, ANN202
        addresses = np.asarray(ptrs.data, dtype=np.uint64).ravel()
        taken = np.broadcast_to(np.asarray(mask.data, dtype=bool), np.shape(ptrs.data)).ravel()
        inside = taken & (addresses >= base) & (addresses < end)
        if inside.any():
            rows = ((addresses[inside] - np.uint64(base)) // np.uint64(row_bytes)).astype(np.int64)
            reads.per_row += np.bincount(rows, minlength=reads.shape[0])
        return original(self, ptrs, mask, other, cache_policy, is_volatile)

    builder.create_masked_load = counted
    try:
        yield reads
    finally:
        builder.create_masked_load = original
