"""The CPU engine's allocator settings: a step's large tensors come from the heap and stay there
when freed, instead of fresh pages that the kernel faults in and zeroes each step."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine.host_allocator import MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES

# In a fresh interpreter (the allocator's state is the process's): glibc's mallinfo2 while a
# 3 MiB tensor is held (mapped bytes beyond those before it) and after it is freed.
PROBE = """
import ctypes, json, sys, torch
from engine.host_allocator import keep_freed_memory
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
before = libc.mallinfo2()
held = torch.ones(3 << 18)
while_held = libc.mallinfo2()
del held
after_free = libc.mallinfo2()
print(json.dumps({"applied": applied, "mmapped_while_held": while_held.hblkhd - before.hblkhd, "heap_free_after": after_free.fordblks}))
"""
TENSOR_BYTES = 3 << 20


def probe(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def glibc() -> None:
    try:
        probe("default")
    except (subprocess.CalledProcessError, AttributeError, OSError):
        pytest.skip("no glibc with mallinfo2 here")


def test_by_default_a_step_sized_tensor_is_a_fresh_mapping(glibc):
    assert probe("default")["mmapped_while_held"] >= TENSOR_BYTES  # glibc's threshold starts at 128 KiB


def test_with_the_settings_it_comes_from_the_heap_and_stays_there(glibc):
    kept = probe("keep")
    assert kept["applied"] is True
    assert kept["mmapped_while_held"] == 0
    assert kept["heap_free_after"] >= TENSOR_BYTES  # not trimmed back to the system


def test_the_settings_cover_a_prefill_steps_intermediates():
    assert MMAP_THRESHOLD_BYTES >= 512 * 1536 * 4 * 4  # [512, 1536] float32, with room for larger models
    assert TRIM_THRESHOLD_BYTES > MMAP_THRESHOLD_BYTES
