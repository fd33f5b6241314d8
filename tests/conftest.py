"""Session-wide test setup.

Without CUDA, Triton kernels run under the interpreter. ``TRITON_INTERPRET`` is read
when ``triton`` decorates a function (its own standard library included, at import),
and some test modules import libraries that import triton, so it is set here, before
any test module is collected.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
