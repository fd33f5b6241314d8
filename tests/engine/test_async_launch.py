"""On CUDA, an engine step queues its work and returns without waiting for the device: the premise of
asynchronous scheduling, where the host prepares step N+1 while the device runs step N.

A host-to-device copy from pageable memory, a host read of a device value or any other
synchronization in a step makes the host wait for every kernel already queued. So a long sleep
is queued on the device before a step, and an event after the sleep: the step must return before
that event has happened (the device still busy afterwards would not do: kernels the step launched
after a synchronization keep it busy too). A failure names the synchronizing calls torch saw. Both
a plain decode step (replayed from its graph, or eager) and a step that admits a request (whose
sampling rows are written to the device) are checked. CUDA only: on the CPU nothing is queued.
"""

from __future__ import annotations

import warnings

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


def synchronizations_in_a_step(engine: EngineCore) -> list[str] | None:
    """Queue a sleep on the device, then one engine step: None if the step returned before the sleep
    ended, else the synchronizing calls torch reported during the step (file:line and message)."""
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    slept = torch.cuda.Event()
    slept.record()
    previous_mode = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            engine.step()
        finally:
            torch.cuda.set_sync_debug_mode(previous_mode)
    returned_first = not slept.query()
    torch.cuda.synchronize()
    if returned_first:
        return None
    return [f"{w.filename}:{w.lineno}: {w.message}" for w in caught] or ["no synchronizing torch call: an event wait, a cudaFree or a module load?"]


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
    assert synchronizations_in_a_step(engine) is None, "a decode step waited for the device"
    # A first admission at the measured step's shapes (a 3-token prefill beside 3 decodes), aborted:
    # a kernel's first use at a new shape may load its module, which waits for the device.
    engine.add_request("warm-up", [12, 13, 14], PARAMS[label])
    for _ in range(2):
        engine.step()
    engine.abort_requests(["warm-up"])
    for _ in range(2):
        engine.step()
    engine.add_request("joining", [9, 10, 11], PARAMS[label])
    waited = synchronizations_in_a_step(engine)
    assert waited is None, f"a step admitting a request waited for the device: {waited}"
