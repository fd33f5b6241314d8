"""Sampling tests. Without CUDA, Triton kernels run under the interpreter.

``TRITON_INTERPRET`` is read when a kernel is decorated, so it is set here, before any
test imports ``sampling.triton`` (the sampler imports it lazily).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config) -> None:  # noqa: ANN001
    # The interpreter's numpy evaluates log(0) and 0/0 on masked lanes that the kernel then discards.
    for message in ("divide by zero encountered", "invalid value encountered"):
        config.addinivalue_line("filterwarnings", f"ignore:{message}:RuntimeWarning:triton.*")
