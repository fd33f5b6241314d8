"""Session-wide test setup.

Without CUDA, Triton kernels run under the interpreter. ``TRITON_INTERPRET`` is read
when ``triton`` decorates a function (its own standard library included, at import),
and some test modules import libraries that import triton, so it is set here, before
any test module is collected.

SIGINT is made to raise ``KeyboardInterrupt`` again where the process started with it ignored (below).

On CUDA, a test after which the device no longer synchronizes (a device-side assert leaves the
process's CUDA context unusable, and every later test in it would fail too) ends the process: under
pytest-xdist, as `make gpu-check` runs the tests, the worker is replaced and that test is reported
as the one that crashed it.

Hypothesis runs without its per-example deadline: `make test` runs its lanes side by side at nice 15
on a machine Ray's workers share, where an example's time says nothing about the code (a test that
must be fast is a benchmark). A failing example's reproduction blob is printed, for CI's output.
"""

import os
import signal
import sys

import pytest
import torch
from hypothesis import settings

settings.register_profile("spout", deadline=None, print_blob=True)
settings.load_profile("spout")

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # `make test` starts its serving lane in the background, and a shell without job control starts
    # background commands with SIGINT ignored, which every child would inherit: the tests that stop a
    # server or a step with Ctrl-C need it, and so does a user's Ctrl-C of `make test`.
    signal.signal(signal.SIGINT, signal.default_int_handler)


if torch.cuda.is_available():

    @pytest.fixture(autouse=True)
    def _end_the_process_on_a_broken_cuda_context():
        yield
        try:
            torch.cuda.synchronize()
        except Exception as error:  # torch.AcceleratorError on a device-side assert
            sys.stderr.write(f"\nthe CUDA context is broken after this test ({error}); ending the process\n")
            sys.stderr.flush()
            os._exit(70)
