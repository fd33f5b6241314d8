"""Session-wide test setup.

``make test`` runs two pytest-xdist workers. Every test that starts Ray or a server (the folders in
``SERVING_TEST_FOLDERS``) joins one xdist group, so those run one after another in one worker, which
shares one Serve app as they always have; the in-process tests of the libraries go to whichever
worker is free. Ray's tests spend much of their time waiting, which the other worker fills.

Without CUDA, Triton kernels run under the interpreter. ``TRITON_INTERPRET`` is read
when ``triton`` decorates a function (its own standard library included, at import),
and some test modules import libraries that import triton, so it is set here, before
any test module is collected.
"""

import os
from pathlib import Path

import pytest
import torch

SERVING_TEST_FOLDERS = ("e2e", "deployments", "cluster", "bench")
"""Tests under these folders of tests/ start Ray, a Serve app or a server: they run one at a time."""
TESTS = Path(__file__).resolve().parent

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(item.path).relative_to(TESTS).parts[0]
        if folder in SERVING_TEST_FOLDERS:
            item.add_marker(pytest.mark.xdist_group("serving"))
