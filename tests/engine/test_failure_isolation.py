"""A failure while admitting or running one request fails that request alone (tiny random model).

One request of a batch of 16 is made to raise (at admission, or mid-generation in its
stop check); the other 15 finish with exactly the tokens they produce without it, the
failed one gets an error output, and the engine goes on serving new requests.
"""

from __future__ import annotations

import pytest

import engine.core
from engine.config import EngineConfig
from engine.core import EngineCore
from engine.loader.checkpoint import Checkpoint
from engine.outputs import FinishReason
from engine.request import Request
from sampling.params import SamplingParams
from tests.engine.conftest import output_ids, run_until_done

NUM_REQUESTS = 16
VICTIM = "r5"


def request_params(index: int) -> SamplingParams:
    """Greedy and seeded sampled requests of different lengths: their tokens do not depend on the batch."""
    if index % 2:
        return SamplingParams(temperature=0.0, max_tokens=6 + index % 5, ignore_eos=True)
    return SamplingParams(temperature=0.9, top_k=50, seed=index, max_tokens=6 + index % 7, ignore_eos=True)


def prompt(index: int) -> list[int]:
    return list(range(200 + 7 * index, 210 + 8 * index))


def make_engine(checkpoint: Checkpoint, async_scheduling: bool) -> EngineCore:
    config = EngineConfig(model="tiny-random", max_num_seqs=8, max_model_len=128, async_scheduling=async_scheduling)
    return EngineCore(config, checkpoint)


def run_batch(engine: EngineCore) -> dict[str, list]:
    for index in range(NUM_REQUESTS):
        engine.add_request(f"r{index}", prompt(index), request_params(index))
    return run_until_done(engine)


@pytest.fixture(scope="module")
def reference(tiny_checkpoint: Checkpoint) -> dict[str, list[int]]:
    outputs = run_batch(make_engine(tiny_checkpoint, async_scheduling=False))
    return {request_id: output_ids(outs) for request_id, outs in outputs.items()}


def fail_admission(monkeypatch: pytest.MonkeyPatch, core: EngineCore, error: Exception) -> None:
    add_request = core.runner.add_request

    def add_or_raise(request: Request) -> None:
        if request.request_id == VICTIM:
            raise error
        add_request(request)

    monkeypatch.setattr(core.runner, "add_request", add_or_raise)


def fail_third_token(monkeypatch: pytest.MonkeyPatch, core: EngineCore, error: Exception) -> None:
    check_stop = engine.core.check_stop

    def check_or_raise(request: Request, eos_token_ids: tuple[int, ...], max_model_len: int):  # noqa: ANN202
        if request.request_id == VICTIM and len(request.output_token_ids) == 3:
            raise error
        return check_stop(request, eos_token_ids, max_model_len)

    monkeypatch.setattr(engine.core, "check_stop", check_or_raise)


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("inject", [fail_admission, fail_third_token])
@pytest.mark.parametrize(("error", "client_fault"), [(ValueError("bad row"), True), (KeyError("bug"), False)])
def test_one_failing_request_leaves_the_others_exact(tiny_checkpoint, reference, monkeypatch, async_scheduling, inject, error, client_fault):
    core = make_engine(tiny_checkpoint, async_scheduling)
    inject(monkeypatch, core, error)
    outputs = run_batch(core)
    for request_id, tokens in reference.items():
        if request_id != VICTIM:
            assert output_ids(outputs[request_id]) == tokens, request_id
            assert outputs[request_id][-1].finish_reason == FinishReason.LENGTH
    last = outputs[VICTIM][-1]
    assert last.finish_reason == FinishReason.ERROR and all(o.finish_reason is None for o in outputs[VICTIM][:-1])
    assert last.error is not None and last.error.client_fault is client_fault and str(error.args[0]) in last.error.message
    assert not core.requests and core.num_running == 0 and len(core.scheduler.free_slots) == 8
    assert core.runner.sampling_batch.params == [None] * 8 and not core.runner.sampling_batch.uses

    monkeypatch.undo()  # the engine keeps serving: the victim, sent again, runs as it did alone
    core.add_request("again", prompt(5), request_params(5))
    assert output_ids(run_until_done(core)["again"]) == reference[VICTIM]


def test_engine_faults_are_not_pinned_on_a_request(tiny_checkpoint, monkeypatch):
    """Out of memory belongs to no request: it leaves step() so that the engine is replaced."""
    core = make_engine(tiny_checkpoint, async_scheduling=False)
    fail_admission(monkeypatch, core, MemoryError())
    core.add_request(VICTIM, prompt(5), request_params(5))
    with pytest.raises(MemoryError):
        core.step()
