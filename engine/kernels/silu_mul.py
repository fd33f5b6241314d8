"""The CPU kernel for the MLP activation of prompt rows in bfloat16 tiles (``silu_mul.cpp``), built once and loaded.

Prompt rows that the bfloat16 tiles compute (`engine.models.prompt_tiles`) leave their gate/up
tile in bfloat16 and enter the down tile in bfloat16. Between them torch took five passes over
the activations: the gate/up output widened to float32, ``silu``, the product, and the result
rounded back to bfloat16 into the down tile's input (1.67 ms a layer for 1,024 rows of the default
model's 1,536-wide MLP, measured here). The kernel reads the bfloat16 tile once and writes the
down tile's bfloat16 input once (0.42 ms), each output computed in float32 and rounded once, as
before: it differs from torch's only where its exp's last bits round across a bfloat16 boundary
(8 of 1.5 million random outputs by one bfloat16 unit, `tests/engine/test_silu_mul_kernel.py`).

``python -m engine.kernels.silu_mul`` builds it (``make install`` does; see `engine.kernels.build`).
``load()`` returns None, and says why in the log, where it cannot be built: the activation then
runs through torch's operations.
"""

from __future__ import annotations

import functools
import logging
from types import ModuleType

import torch

from engine.kernels.build import load_kernel

LANES = 16
"""The kernel's columns go 16 at a time: the intermediate size must be a multiple of it."""


@functools.cache
def load() -> ModuleType | None:
    """The compiled module (``silu_mul_bf16``), or None if it cannot be built here."""
    return load_kernel("silu_mul", "the prompt tiles' MLP activation runs through torch's operations")


def silu_mul_bf16(gate_up: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """gate_up: [R, 2I] bfloat16 (gate columns, then up) -> ``out`` [R, I] bfloat16 = silu(gate) * up,
    computed in float32 and rounded once; rows may be any stride apart. Needs the built kernel."""
    kernel = load()
    assert kernel is not None, "the silu-mul kernel is not built here"
    kernel.silu_mul_bf16(gate_up, out)
    return out


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    print("silu-mul kernel:", "built" if load() is not None else "unavailable")
