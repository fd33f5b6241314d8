"""glibc's allocator set to keep the memory a CPU step frees, so the next step does not fault it in again.

torch on the CPU takes every tensor from ``malloc``. glibc serves blocks above its mmap threshold
(128 KiB at start, raised up to 32 MiB as such blocks are freed) with a fresh ``mmap`` and trims
the heap's free top back to the system: a prefill step's intermediates ([512, 1536] float32 is
3 MiB) then come back as new pages, each one faulted in and zeroed by the kernel. Measured on
the default model, one thread, three prefills of 32 prompts of 128 tokens each in separate processes
(a llama.cpp build at nice 19 sharing the cores): about a million minor faults and 1.1-2.4 s of system time per 4,096
prompt tokens, 13-17.5 s in all, against no faults and 11.2-14.2 s with the settings below.
Whether the faults happen depends on the sizes a process has freed before, so they come and go
between runs; these settings leave only the fast case (tests/engine/test_host_allocator.py).

The cost: memory a step frees stays in the process (up to the largest step's working set, tens
of MiB for the default model) instead of going back to the system between steps.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
"""``mallopt`` parameters (glibc's malloc.h)."""

MMAP_THRESHOLD_BYTES = 32 << 20
"""Blocks below this come from the heap: glibc's largest threshold on 64-bit systems."""
TRIM_THRESHOLD_BYTES = 1 << 30
"""Free heap top kept before any goes back to the system."""
TOP_PAD_BYTES = 64 << 20
"""Extra heap asked for at each growth, so that a step's first large tensors do not grow it one by one."""


def keep_freed_memory() -> bool:
    """Apply the settings above to this process's glibc allocator; False where there is no glibc
    (another libc, or ``mallopt`` refused a value), and the allocator stays as it was."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    settings = ((M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES), (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES), (M_TOP_PAD, TOP_PAD_BYTES))
    applied = all(mallopt(parameter, value) == 1 for parameter, value in settings)
    if not applied:
        logger.warning("glibc's mallopt refused the allocator settings: CPU steps may fault freed memory back in")
    return applied
