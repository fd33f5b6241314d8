"""Batching is invisible: requests generated together give exactly the greedy tokens each gives alone."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.generate import generate
from engine.outputs import EngineOutput
from engine.scheduler import ScheduledStep
from sampling.params import SamplingParams
from tests.engine.conftest import output_ids

PROMPTS = [
    "The capital of France is",
    "Hi",
    "List three colours: red,",
    "In 1969, the first humans landed on the Moon. The mission was called",
    "def add(a, b):\n    return",
    "A haiku about autumn leaves:\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. Again:",
    "Water boils at",
]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def alone(smollm_checkpoint) -> dict[str, list[int]]:
    engine = EngineCore(EngineConfig(max_num_seqs=1, max_model_len=256, dtype="float32"), smollm_checkpoint)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    return {prompt: generate(engine, engine.tokenizer.encode(prompt), params) for prompt in PROMPTS}


def test_prompts_differ_in_length(smollm_checkpoint):
    lengths = {len(smollm_checkpoint.tokenizer.encode(p)) for p in PROMPTS}
    assert len(lengths) >= 6


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_batched_with_chunked_prefill_and_mid_flight_joins_matches_alone(smollm_checkpoint, alone, async_scheduling):
    # 5 slots for 8 requests (3 wait for a free slot), and a token budget of 8 per
    # step, so long prompts are prefilled in chunks alongside other requests' decodes.
    config = EngineConfig(max_num_seqs=5, max_model_len=256, max_num_batched_tokens=8, async_scheduling=async_scheduling, dtype="float32")
    engine = EngineCore(config, smollm_checkpoint)
    steps: list[ScheduledStep] = []
    schedule = engine.scheduler.schedule
    engine.scheduler.schedule = lambda admit: steps.append(schedule(admit)) or steps[-1]  # type: ignore[method-assign]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    outputs: dict[str, list[EngineOutput]] = {}
    pending = list(enumerate(PROMPTS))
    while pending or engine.has_unfinished_requests():
        # Requests join mid-flight: one new request every third step.
        if pending and len(steps) % 3 == 0:
            index, prompt = pending.pop(0)
            engine.add_request(str(index), engine.tokenizer.encode(prompt), params)
        for output in engine.step():
            outputs.setdefault(output.request_id, []).append(output)
        assert len(steps) < 2000
    for index, prompt in enumerate(PROMPTS):
        assert output_ids(outputs[str(index)]) == alone[prompt], prompt
    chunked = [c for step in steps for c in step.chunks if c.num_tokens > 1 and c.position > 0]
    mixed = [step for step in steps if {c.num_tokens == 1 for c in step.chunks} == {True, False}]
    assert chunked, "no prompt was prefilled in more than one chunk"
    assert mixed, "no step mixed decode tokens with a prefill chunk"
    assert max(len(step.chunks) for step in steps) == 5
    assert any(step.placeholder_inputs for step in steps) == async_scheduling
