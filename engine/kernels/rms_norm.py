"""The CPU RMS-norm kernel (``rms_norm.cpp``), built once and loaded.

A float32 CPU engine's norms (two a layer and the final one) call it in place of torch's
``F.rms_norm``, whose float32 composite costs about twenty operator calls a norm (the squares,
their mean, the epsilon, the reciprocal square root, two products): at one token a step, 61
norms took about 1.6 ms of the default model's 15 ms step. The kernel sums the squares in
torch's own order and rounds every operation as torch does, so the result is torch's bit for bit
(`tests/engine/test_rms_norm_kernel.py`).

``python -m engine.kernels.rms_norm`` builds it (``make install`` does; see
`engine.kernels.build`). ``load()`` returns None, and says why in the log, where it cannot be
built: the norms then run through ``F.rms_norm``.
"""

from __future__ import annotations

import functools
import logging
from types import ModuleType

import torch
import torch.nn.functional as F

from engine.kernels.build import load_kernel

logger = logging.getLogger(__name__)

ROW_MULTIPLE = 32
"""The kernel's rows are whole groups of four 8-float vectors (every hidden size of the models served)."""


@functools.cache
def load() -> ModuleType | None:
    """The compiled module (``rms_norm``), or None if it cannot be built here."""
    return load_kernel("rms_norm", "the norms run through F.rms_norm")


def can_fuse(device: torch.device, dtype: torch.dtype, hidden_size: int) -> bool:
    """Whether a model on ``device`` in ``dtype`` can normalize through the kernel: float32 on the
    CPU, a hidden size that is a multiple of 32, the kernel built and giving torch's bits here."""
    return device.type == "cpu" and dtype == torch.float32 and hidden_size % ROW_MULTIPLE == 0 and load() is not None and matches_torch(hidden_size)


@functools.cache
def matches_torch(hidden_size: int) -> bool:
    """Whether the kernel gives ``F.rms_norm``'s bits for rows of ``hidden_size`` on this machine: the
    order it copies is that of ATen's CPU sum, which another torch build or CPU could change."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, hidden_size, generator=generator) * torch.rand(64, 1, generator=generator).mul(100)
    weight = torch.randn(hidden_size, generator=generator)
    same = torch.equal(rms_norm(x, weight, 1e-5), F.rms_norm(x, [hidden_size], weight, 1e-5))
    if not same:
        logger.warning("the RMS-norm kernel's sums differ from torch's here: the norms run through F.rms_norm")
    return same


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [T, n] float32 -> ``F.rms_norm(x, [n], weight, eps)`` [T, n], the same bits. Needs the built kernel."""
    kernel = load()
    assert kernel is not None, "the RMS-norm kernel is not built here"
    return kernel.rms_norm(x.contiguous(), weight, eps)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    print("RMS-norm kernel:", "built" if load() is not None else "unavailable")
