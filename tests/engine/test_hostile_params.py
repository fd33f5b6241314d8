"""Validated `SamplingParams` never make a step raise: whatever passes validation runs (tiny random model)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.core import NO_TOKEN_LEFT, EngineCore, InvalidRequestError
from engine.loader.checkpoint import Checkpoint
from engine.outputs import FinishReason
from sampling.params import MAX_INT64, SamplingParams
from sampling.tokenized import tokenize_strings
from tests.engine.conftest import output_ids, run_until_done

PROMPT = list(range(300, 310))
VOCAB = 49152


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async"])
def engine(tiny_checkpoint: Checkpoint, request: pytest.FixtureRequest) -> EngineCore:
    """One engine for every example: a request that broke it would break the examples after it. Scheduled
    synchronously (the CPU's default) and asynchronously (CUDA's: the next step is launched before this
    one's tokens reach the host, so it is fed a failed row's placeholder token)."""
    config = EngineConfig(model="tiny-random", max_num_seqs=4, max_model_len=48, max_num_batched_tokens=64, async_scheduling=request.param)
    return EngineCore(config, tiny_checkpoint)


def test_forty_distinct_dry_breakers_run(engine: EngineCore) -> None:
    """The issue's reproduction: more breaker tokens than the sampler's old fixed-width table held."""
    breakers = [engine.tokenizer.decode([token]) for token in range(1000, 1040)]
    assert len({t for b in breakers for t in engine.tokenizer.encode(b)}) > 32
    params = SamplingParams(dry_multiplier=0.8, dry_sequence_breakers=breakers, max_tokens=8, seed=1)
    engine.add_request("dry", PROMPT, params, tokenize_strings(params, engine.tokenizer.encode))
    engine.add_request("greedy", PROMPT, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    outputs = run_until_done(engine)
    assert sum(len(o.new_token_ids) for o in outputs["greedy"]) == 8
    assert outputs["dry"][-1].finish_reason is not None


token_ids = st.integers(0, VOCAB - 1)
words = st.text(min_size=1, max_size=12)
params_strategy = st.fixed_dictionaries(
    {},
    optional={
        "temperature": st.sampled_from([0.0, 5e-324, 1e-40, 1e-8, 0.5, 1.0, 3.0, 1e30, 1e300]),
        "top_k": st.sampled_from([-1, 0, 1, 5, VOCAB, MAX_INT64]),
        "top_p": st.sampled_from([1e-9, 0.5, 1.0]),
        "min_p": st.sampled_from([0.0, 0.5, 1.0]),
        "typical_p": st.sampled_from([1e-9, 0.5, 1.0]),
        "top_n_sigma": st.sampled_from([-1.0, 0.0, 1e-9, 1.0]),
        "presence_penalty": st.sampled_from([-2.0, 0.0, 2.0]),
        "frequency_penalty": st.sampled_from([-2.0, 0.0, 2.0]),
        "repetition_penalty": st.sampled_from([1e-9, 1.0, 1.5, 1e30]),
        "dry_multiplier": st.sampled_from([0.0, 0.8, 1e30]),
        "dry_base": st.sampled_from([1.0, 1.75, 1e30]),
        "dry_allowed_length": st.sampled_from([0, 1, 2, MAX_INT64]),
        "dry_penalty_last_n": st.sampled_from([-1, 0, 1, MAX_INT64]),
        "dry_sequence_breakers": st.lists(words, max_size=64),
        "xtc_threshold": st.sampled_from([0.0, 0.1, 0.5]),
        "xtc_probability": st.sampled_from([0.0, 1.0]),
        "seed": st.sampled_from([None, -(2**63), -1, 0, 2**63 - 1, 2**64 - 1]),
        "stop_token_ids": st.lists(token_ids, max_size=64),
        "ignore_eos": st.booleans(),
        "max_tokens": st.sampled_from([None, 1, 6]),
        "min_tokens": st.sampled_from([0, 1, 6]),
        "logprobs": st.sampled_from([None, 0, 20]),
        "logit_bias": st.dictionaries(token_ids, st.floats(-1e30, 1e30), max_size=32),
        "allowed_token_ids": st.none() | st.lists(token_ids, min_size=1, max_size=16),
        "bad_words": st.lists(words, max_size=8),
        "num_speculative_tokens": st.sampled_from([None, 0, 3, 16]),
        "prompt_lookup_min": st.sampled_from([None, 1, 16]),
        "prompt_lookup_max": st.sampled_from([None, 1, 16]),
        "guidance_scale": st.sampled_from([1.0, -100.0, 0.0, 3.0]),
        "negative_prompt": st.none() | words,
    },
)


@given(st.lists(params_strategy, min_size=1, max_size=5))
@settings(
    max_examples=int(os.environ.get("HOSTILE_EXAMPLES", 30)), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
def test_validated_params_never_make_a_step_raise(engine: EngineCore, batch: list[dict]) -> None:
    admitted = []
    for index, fields in enumerate(batch):
        fields = {**fields, "max_tokens": fields.get("max_tokens") or 6, "min_tokens": min(fields.get("min_tokens", 0), 6)}
        try:
            params = SamplingParams(**fields)
            engine.add_request(f"r{index}", PROMPT, params, tokenize_strings(params, engine.tokenizer.encode))
        except (ValueError, InvalidRequestError):
            continue  # refused at validation: that is allowed
        admitted.append(f"r{index}")
    outputs = run_until_done(engine, max_steps=500)
    for request_id in admitted:
        last = outputs[request_id][-1]
        if last.finish_reason is FinishReason.ERROR:  # its penalties left no token to sample: it fails alone, typed
            assert last.error is not None and (last.error.message, last.error.client_fault) == (NO_TOKEN_LEFT, True)
        else:
            assert last.finish_reason in (FinishReason.STOP, FinishReason.LENGTH), last.error
        assert all(0 <= token < VOCAB for token in output_ids(outputs[request_id]))


def test_penalties_that_leave_no_token_fail_that_request_alone(engine: EngineCore) -> None:
    """Only two prompt tokens allowed, pushed below 0 by their bias, then times an infinite repetition penalty:
    every logit is -inf. The request fails with its reason instead of emitting an arbitrary token."""
    allowed = PROMPT[:2]
    params = SamplingParams(allowed_token_ids=allowed, logit_bias={t: -100.0 for t in allowed}, repetition_penalty=1e39, max_tokens=4, seed=3)
    engine.add_request("no-token", PROMPT, params, tokenize_strings(params, engine.tokenizer.encode))
    engine.add_request("beside", PROMPT, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    outputs = run_until_done(engine)
    failed = outputs["no-token"][-1]
    assert failed.finish_reason is FinishReason.ERROR and failed.error is not None and failed.error.message == NO_TOKEN_LEFT
    assert output_ids(outputs["no-token"]) == []
    assert len(output_ids(outputs["beside"])) == 4 and outputs["beside"][-1].finish_reason is FinishReason.LENGTH
