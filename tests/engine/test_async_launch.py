"""On CUDA, an engine step queues its work and returns without waiting for the device: the premise of
asynchronous scheduling, where the host prepares step N+1 while the device runs step N.

A host-to-device copy from pageable memory, a host read of a device value or any other
synchronization in a step makes the host wait for every kernel already queued. So a long sleep
is queued on the device before a step: the step must return while the device still sleeps. Both
a plain decode step (replayed from its graph, or eager) and a step that admits a request (whose
sampling rows are written to the device) are checked. CUDA only: on the CPU nothing is queued.
"""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.loader.checkpoint import Checkpoint
from sampling.params import SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: on the CPU a step runs as it is launched")

SLEEP_CYCLES = 1_000_000_000
"""The device's sleep before a step: about half a second at current GPUs' clocks, where a step of
this tiny model takes milliseconds of host time."""

PARAMS = {
    "greedy": SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True),
    "top_k_top_p_seeded": SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=7, max_tokens=64, ignore_eos=True),
    "logprobs": SamplingParams(temperature=0.0, logprobs=3, max_tokens=64, ignore_eos=True),
}


def returns_while_the_device_sleeps(engine: EngineCore) -> bool:
    """Queue a sleep on the device, then one engine step: whether the step returned before the sleep ended."""
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    engine.step()
    device_busy = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    return device_busy


@pytest.mark.parametrize("cuda_graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("label", list(PARAMS))
def test_a_step_returns_before_the_device_has_run_the_one_before(tiny_checkpoint: Checkpoint, cuda_graphs: bool, label: str) -> None:
    config = EngineConfig(model="tiny-random", device="cuda", dtype="float32", max_num_seqs=8, max_model_len=128, cuda_graphs=cuda_graphs)
    engine = EngineCore(config, tiny_checkpoint)
    assert engine.async_scheduling
    for index in range(3):
        engine.add_request(f"r{index}", [5 + index, 6, 7, 8], PARAMS[label])
    for _ in range(4):  # the prefill and a few decodes: every kernel compiled, every buffer allocated
        engine.step()
    assert returns_while_the_device_sleeps(engine), "a decode step waited for the device"
    engine.add_request("joining", [9, 10, 11], PARAMS[label])
    assert returns_while_the_device_sleeps(engine), "a step admitting a request waited for the device"
