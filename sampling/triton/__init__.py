"""Triton kernels for truncation (min-p, top-k, top-p) and the seeded exponential-race draw.

Import this package only when the kernels are needed: ``TRITON_INTERPRET`` is read
when the kernels are decorated, so tests set it before the first import.
"""

from sampling.triton.sample import triton_sample

__all__ = ["triton_sample"]
