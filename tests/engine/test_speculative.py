"""Speculative decoding: drafted tokens verified exactly, rejected ones leave nothing behind."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.loader.checkpoint import Checkpoint
from engine.ngram_drafter import NgramIndex
from engine.outputs import FinishReason
from sampling.params import SamplingParams
from sampling.tokenized import tokenize_strings
from tests.engine.conftest import output_ids, run_until_done

PASSAGE = "The quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat by the door."
REPEAT_PROMPT = f"Repeat this sentence exactly, three times.\n{PASSAGE}\n{PASSAGE}\n"
PEAKY_VOCAB = 512
PEAKY_LOGIT_SCALE = 10.0
NUM_SAMPLES = 20_000
MAX_TOKENS = 32


def smollm_engine(checkpoint: Checkpoint, **overrides) -> EngineCore:
    return EngineCore(EngineConfig(**({"max_num_seqs": 4, "max_model_len": 512} | overrides)), checkpoint)


def generate_all(engine: EngineCore, prompts: dict[str, list[int]], params: SamplingParams) -> dict[str, list[int]]:
    for request_id, prompt in prompts.items():
        engine.add_request(request_id, prompt, params, tokenize_strings(params, engine.tokenizer.encode))
    outputs = run_until_done(engine)
    return {request_id: output_ids(outputs[request_id]) for request_id in prompts}


@pytest.fixture(scope="module")
def repeat_prompt(smollm_checkpoint) -> list[int]:
    return smollm_checkpoint.tokenizer.encode(REPEAT_PROMPT)


@pytest.fixture(scope="module")
def plain_repeat(smollm_checkpoint, repeat_prompt) -> list[int]:
    """The greedy continuation of the repeat prompt without speculation."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    return generate_all(smollm_engine(smollm_checkpoint), {"r": repeat_prompt}, params)["r"]


def test_greedy_speculation_gives_the_tokens_of_plain_decoding(smollm_checkpoint, repeat_prompt, plain_repeat):
    open_prompt = smollm_checkpoint.tokenizer.encode("Three facts about the Moon:\n1.")
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    plain_open = generate_all(smollm_engine(smollm_checkpoint), {"open": open_prompt}, params)["open"]
    engine = smollm_engine(smollm_checkpoint, num_speculative_tokens=4)
    speculated = generate_all(engine, {"repeat": repeat_prompt, "open": open_prompt}, params)
    assert speculated == {"repeat": plain_repeat, "open": plain_open}
    assert 0 < engine.num_accepted_tokens < engine.num_draft_tokens


def test_kv_entries_of_rejected_drafts_are_never_read(smollm_checkpoint, repeat_prompt, plain_repeat):
    """Poison every cache position past each sequence's accepted tokens after every step."""
    engine = smollm_engine(smollm_checkpoint, num_speculative_tokens=6)
    engine.add_request("r", repeat_prompt, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    generated: list[int] = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            generated += output.new_token_ids
        block_size = engine.runner.kv_cache.block_size
        for request in engine.scheduler.running:
            for position in range(request.num_computed_tokens, len(request.kv.block_ids) * block_size):
                for cache in engine.runner.kv_cache.keys + engine.runner.kv_cache.values:
                    cache[request.kv.block_ids[position // block_size], position % block_size] = float("nan")
    assert generated == plain_repeat
    assert engine.num_draft_tokens > engine.num_accepted_tokens > 0


def test_stop_token_inside_an_accepted_run_truncates_it(smollm_checkpoint, repeat_prompt, plain_repeat):
    stop_id = plain_repeat[25]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, stop_token_ids=[stop_id], logprobs=2)
    engine = smollm_engine(smollm_checkpoint, num_speculative_tokens=8)
    engine.add_request("r", repeat_prompt, params)
    outputs = run_until_done(engine)["r"]
    tokens = output_ids(outputs)
    assert tokens == plain_repeat[: plain_repeat.index(stop_id) + 1]
    assert outputs[-1].finish_reason == FinishReason.STOP and outputs[-1].stop_reason == stop_id
    assert all(len(o.logprobs or []) == len(o.new_token_ids) for o in outputs)
    assert engine.num_generated("r") == len(tokens)
    assert any(len(o.new_token_ids) > 1 for o in outputs)


def test_max_tokens_inside_an_accepted_run_truncates_it(smollm_checkpoint, repeat_prompt, plain_repeat):
    engine = smollm_engine(smollm_checkpoint, num_speculative_tokens=8)
    params = SamplingParams(temperature=0.0, max_tokens=13)
    assert generate_all(engine, {"r": repeat_prompt}, params)["r"] == plain_repeat[:13]


def test_guidance_with_speculation_gives_the_tokens_of_guidance_alone(smollm_checkpoint, repeat_prompt):
    params = SamplingParams(temperature=0.0, max_tokens=16, guidance_scale=1.5, negative_prompt="Say something else.")
    plain = generate_all(smollm_engine(smollm_checkpoint), {"r": repeat_prompt}, params)["r"]
    engine = smollm_engine(smollm_checkpoint, num_speculative_tokens=4)
    assert generate_all(engine, {"r": repeat_prompt}, params)["r"] == plain
    assert engine.num_accepted_tokens > 0


def test_request_can_turn_speculation_off(smollm_checkpoint, repeat_prompt):
    engine = smollm_engine(smollm_checkpoint, num_speculative_tokens=4)
    generate_all(engine, {"r": repeat_prompt}, SamplingParams(temperature=0.0, max_tokens=8, num_speculative_tokens=0))
    assert engine.num_draft_tokens == 0


# ---- exactness of the sampled distribution ---------------------------------------------------


@pytest.fixture(scope="module")
def peaky_checkpoint(tiny_checkpoint) -> Checkpoint:
    """The tiny random model cut to a small vocabulary, its lm_head scaled so that a few tokens
    carry most of each distribution: drafts are then often, but not always, accepted."""
    weights = dict(tiny_checkpoint.weights)
    weights["embed_tokens.weight"] = weights["embed_tokens.weight"][:PEAKY_VOCAB]
    weights["lm_head.weight"] = weights["lm_head.weight"][:PEAKY_VOCAB] * PEAKY_LOGIT_SCALE
    config = dataclasses.replace(tiny_checkpoint.config, vocab_size=PEAKY_VOCAB)
    return dataclasses.replace(tiny_checkpoint, config=config, weights=weights)


def peaky_engine(checkpoint: Checkpoint, num_speculative_tokens: int) -> EngineCore:
    config = EngineConfig(
        model="tiny-random", max_num_seqs=1024, max_model_len=64, max_num_batched_tokens=65536,
        num_speculative_tokens=num_speculative_tokens, prompt_lookup_min=1, prompt_lookup_max=3,
    )  # fmt: skip
    return EngineCore(config, checkpoint)


def repeating_prompt(checkpoint: Checkpoint) -> list[int]:
    """``start``, the model's greedy continuation of it, then ``start`` again: prompt lookup
    drafts that continuation, which the model finds likely but not certain."""
    start = [5, 17, 42, 7]
    continuation = generate_all(peaky_engine(checkpoint, 0), {"g": start}, SamplingParams(temperature=0.0, max_tokens=4))["g"]
    return start + continuation + start


def first_tokens(checkpoint: Checkpoint, prompt: list[int], params: SamplingParams, num_spec: int, seed_base: int):
    engine = peaky_engine(checkpoint, num_spec)
    for i in range(NUM_SAMPLES):
        engine.add_request(str(i), prompt, params.model_copy(update={"seed": seed_base + i}))
    outputs = run_until_done(engine)
    return Counter(tuple(output_ids(outputs[str(i)])) for i in range(NUM_SAMPLES)), engine


def homogeneity_p_value(a: Counter, b: Counter) -> float:
    """Chi-square test that two samples share a distribution; cells expected below 5 are pooled."""
    cells = sorted(set(a) | set(b), key=lambda key: -(a[key] + b[key]))
    table, pooled = [], np.zeros(2)
    for key in cells:
        if a[key] + b[key] >= 10:
            table.append([a[key], b[key]])
        else:
            pooled += [a[key], b[key]]
    if pooled.sum() >= 10:
        table.append(list(pooled))
    assert len(table) >= 10, "too few cells for a meaningful test"
    return chi2_contingency(np.array(table).T)[1]


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_first_three_tokens_are_distributed_as_without_speculation(peaky_checkpoint, top_p):
    prompt = repeating_prompt(peaky_checkpoint)
    assert NgramIndex(1, 3).propose(prompt, 3), "the prompt must give prompt lookup something to draft"
    params = SamplingParams(temperature=1.0, top_p=top_p, max_tokens=3, ignore_eos=True)
    plain, _ = first_tokens(peaky_checkpoint, prompt, params, num_spec=0, seed_base=0)
    speculated, engine = first_tokens(peaky_checkpoint, prompt, params, num_spec=3, seed_base=NUM_SAMPLES)
    assert 0.05 * engine.num_draft_tokens < engine.num_accepted_tokens < 0.95 * engine.num_draft_tokens
    assert homogeneity_p_value(plain, speculated) > 0.001
