"""`bench.lib.step_profile`: per-call figures from torch's profiler, a failed profile costing only its own row,
and an engine left idle after its decode steps are profiled, whether the profiler worked or not."""

from __future__ import annotations

import pytest
import torch

import bench.lib.step_profile as step_profile
from bench.lib.step_profile import profile_calls, profile_decode, profile_row
from engine.config import EngineConfig
from engine.core import EngineCore
from engine.loader.checkpoint import Checkpoint, load_checkpoint
from engine.loader.random_shapes import TINY_RANDOM


@pytest.fixture(scope="module")
def tiny_checkpoint() -> Checkpoint:
    return load_checkpoint(TINY_RANDOM)


def test_a_profile_is_per_call() -> None:
    x = torch.randn(64, 64)
    profiled = profile_calls(lambda: torch.mm(x, x), calls=4, cuda=False)
    mm = next(call for call in profiled.top_host_ops if call.name == "aten::mm")
    assert profiled.calls == 4 and profiled.wall_ms_per_call > 0 and profiled.device_busy_ms_per_call is None
    assert mm.count_per_call == 1.0


def test_a_failed_profile_is_its_error() -> None:
    def refused() -> step_profile.CallsProfile:
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")

    assert profile_row(refused) == {"error": "RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"}


@pytest.mark.parametrize("fails", [False, True])
def test_the_engine_is_left_idle(tiny_checkpoint, monkeypatch, fails: bool) -> None:
    engine = EngineCore(EngineConfig(model="tiny-random", max_num_seqs=4, max_model_len=64), tiny_checkpoint)
    if fails:

        def refused(*args: object) -> step_profile.CallsProfile:
            raise RuntimeError("profiler refused")

        monkeypatch.setattr(step_profile, "profile_calls", refused)
        assert "error" in profile_row(lambda: profile_decode(engine, 3, 5, 2))
    else:
        profiled = profile_decode(engine, 3, 5, 2)
        assert profiled.calls == 2 and profiled.wall_ms_per_call > 0
    assert not engine.has_unfinished_requests()
