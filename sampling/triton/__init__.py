"""Triton kernel for the truncations (min-p, top-k, top-p, typical-p, top-nσ, XTC) and the seeded draw.

Import this package only when the kernels are needed: ``TRITON_INTERPRET`` is read
when the kernels are decorated, so tests set it before the first import.
"""

from sampling.triton.sample import triton_sample

__all__ = ["triton_sample"]
