"""Sampling tests. Without CUDA, Triton kernels run under the interpreter.

``TRITON_INTERPRET`` is read when a kernel is decorated, so it is set here, before any
test imports ``sampling.triton`` (the sampler imports it lazily).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
