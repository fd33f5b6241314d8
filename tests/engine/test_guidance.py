"""Classifier-free guidance: a companion sequence scheduled with its parent, never seen outside."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.core import EngineCore, InvalidRequestError
from sampling.params import SamplingParams
from sampling.tokenized import tokenize_strings
from tests.engine.conftest import output_ids, run_until_done

PROMPT = [1, 504, 3458, 282, 4649, 314]
NEGATIVE_PROMPT = "a list of numbers"


class RecordingSampler:
    """Passes every call through to the engine's sampler, keeping the logits it was given."""

    def __init__(self, sampler) -> None:
        self.sampler = sampler
        self.logits: list[torch.Tensor] = []

    def __call__(self, logits, rows, batch, grammar=None):
        self.logits.append(logits.clone())
        return self.sampler(logits, rows, batch, grammar)


def tiny_engine(tiny_checkpoint, **overrides) -> EngineCore:
    settings = {"model": "tiny-random", "max_num_seqs": 4, "max_model_len": 64, "max_num_batched_tokens": 64, "dtype": "float32"} | overrides
    return EngineCore(EngineConfig(**settings), checkpoint=tiny_checkpoint)


def generate(engine: EngineCore, prompt: list[int], params: SamplingParams) -> list[int]:
    engine.add_request("r", prompt, params, tokenize_strings(params, engine.tokenizer.encode))
    outputs = run_until_done(engine)
    assert list(outputs) == ["r"]  # the companion never shows up
    return output_ids(outputs["r"])


def next_token_logits(tiny_checkpoint, token_ids: list[int]) -> torch.Tensor:
    """Logits after ``token_ids``, from a separate engine prefilling them in one pass."""
    engine = tiny_engine(tiny_checkpoint)
    engine.runner.fuse_argmax = False  # greedy, so that the sampler sees the logits
    recorder = RecordingSampler(engine.runner.sampler)
    engine.runner.sampler = recorder
    generate(engine, token_ids, SamplingParams(temperature=0.0, max_tokens=1))
    return recorder.logits[0][0]


def test_scale_one_is_plain_decoding(tiny_checkpoint):
    params = SamplingParams(temperature=1.0, seed=7, max_tokens=12)
    plain = generate(tiny_engine(tiny_checkpoint), PROMPT, params)
    guided_engine = tiny_engine(tiny_checkpoint)
    guided = generate(guided_engine, PROMPT, params.model_copy(update={"guidance_scale": 1.0, "negative_prompt": NEGATIVE_PROMPT}))
    assert guided == plain


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("negative_prompt", [None, NEGATIVE_PROMPT])
def test_sampled_logits_follow_the_guidance_formula(tiny_checkpoint, async_scheduling, negative_prompt):
    scale = 2.5
    engine = tiny_engine(tiny_checkpoint, async_scheduling=async_scheduling, max_num_batched_tokens=4)
    recorder = RecordingSampler(engine.runner.sampler)
    engine.runner.sampler = recorder
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=5, guidance_scale=scale, negative_prompt=negative_prompt)
    output = generate(engine, PROMPT, params)
    assert len(output) == 5 and len(recorder.logits) == 5
    negative = engine.tokenizer.encode(negative_prompt) if negative_prompt else [engine.tokenizer.bos_token_id]
    for position, sampled_logits in enumerate(recorder.logits):
        conditional = next_token_logits(tiny_checkpoint, PROMPT + output[:position])
        unconditional = next_token_logits(tiny_checkpoint, negative + output[:position])
        expected = unconditional + scale * (conditional - unconditional)
        torch.testing.assert_close(sampled_logits[0], expected, atol=1e-4, rtol=1e-4)


def test_guidance_changes_the_output_and_frees_both_slots(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint)
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    plain = generate(engine, PROMPT, greedy)
    guided = generate(engine, PROMPT, greedy.model_copy(update={"guidance_scale": 8.0, "negative_prompt": NEGATIVE_PROMPT}))
    assert guided != plain
    assert len(engine.scheduler.free_slots) == 4


def test_abort_frees_the_companion_slot(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint, max_num_seqs=2)
    engine.add_request("guided", PROMPT, SamplingParams(max_tokens=50, guidance_scale=3.0))
    engine.add_request("plain", PROMPT, SamplingParams(max_tokens=3))
    engine.step()
    assert engine.num_running == 1 and engine.num_waiting == 1  # the guided request holds both slots
    engine.abort_requests(["guided"])
    outputs = run_until_done(engine)
    assert outputs["guided"][-1].finish_reason == "abort"
    assert len(output_ids(outputs["plain"])) == 3
    assert len(engine.scheduler.free_slots) == 2


def test_guidance_needs_two_slots(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint, max_num_seqs=1)
    with pytest.raises(InvalidRequestError, match="guidance_scale"):
        engine.add_request("r", PROMPT, SamplingParams(guidance_scale=2.0))
