"""Structured outputs in the engine (tiny-random): every output satisfies its constraint, greedy and
sampled, with and without speculative decoding (greedy: the same tokens) and with guidance; a
dead end finishes the request with its own reason; a bad grammar fails only its request."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.outputs import EngineOutput, FinishReason
from sampling.params import SamplingParams
from sampling.tokenized import tokenize_strings
from tests.engine.conftest import output_ids, run_until_done

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["red", "green"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
REGEX = r"[0-9]{3}-[a-z]{2,4}"
CHOICES = ["yes", "no", "maybe not"]
CONSTRAINTS = {"json": {"json": SCHEMA}, "regex": {"regex": REGEX}, "choice": {"choice": CHOICES}}
# A prompt whose n-grams the drafter finds again in JSON output, so speculation drafts tokens.
PROMPT_TEXT = 'Answer as JSON: {"name":"ab","age":12,"tags":["red","red"]} {"name":"ab","age":12,"tags":["red"]}'
SEEDS = range(6)
MAX_TOKENS = 80


def tiny_engine(tiny_checkpoint, **overrides) -> EngineCore:
    settings = {"model": "tiny-random", "max_num_seqs": 8, "max_model_len": 256, "max_num_batched_tokens": 256} | overrides
    return EngineCore(EngineConfig(**settings), checkpoint=tiny_checkpoint)


def generate(engine: EngineCore, params: dict[str, SamplingParams]) -> dict[str, list[EngineOutput]]:
    prompt = engine.tokenizer.encode(PROMPT_TEXT)
    for request_id, p in params.items():
        engine.add_request(request_id, prompt, p, tokenize_strings(p, engine.tokenizer.encode))
    return run_until_done(engine)


def check_satisfies(kind: str, text: str) -> None:
    if kind == "json":
        jsonschema.validate(json.loads(text), SCHEMA)
    elif kind == "regex":
        assert re.fullmatch(REGEX, text), text
    else:
        assert text in CHOICES, text


def constrained_params(**overrides) -> dict[str, SamplingParams]:
    """Every constraint, greedy and at temperature 1 with several seeds."""
    params = {}
    for kind, constraint in CONSTRAINTS.items():
        params[f"{kind}-greedy"] = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, structured_outputs=constraint, **overrides)
        for seed in SEEDS:
            params[f"{kind}-{seed}"] = SamplingParams(temperature=1.0, seed=seed, max_tokens=MAX_TOKENS, structured_outputs=constraint, **overrides)
    return params


def check_all(engine: EngineCore, outputs: dict[str, list[EngineOutput]]) -> dict[str, list[int]]:
    tokens = {}
    for request_id, request_outputs in outputs.items():
        assert request_outputs[-1].finish_reason == FinishReason.STOP, (request_id, request_outputs[-1])
        tokens[request_id] = output_ids(request_outputs)
        check_satisfies(request_id.split("-")[0], engine.tokenizer.decode(tokens[request_id]))
    return tokens


@pytest.fixture(scope="module")
def plain_tokens(tiny_checkpoint) -> dict[str, list[int]]:
    engine = tiny_engine(tiny_checkpoint)
    return check_all(engine, generate(engine, constrained_params()))


def test_every_output_satisfies_its_constraint(plain_tokens):
    assert len(plain_tokens) == len(CONSTRAINTS) * (len(SEEDS) + 1)


def test_constrained_output_with_speculation_is_valid_and_greedy_is_unchanged(tiny_checkpoint, plain_tokens):
    engine = tiny_engine(tiny_checkpoint, num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=3)
    speculated = check_all(engine, generate(engine, constrained_params()))
    assert engine.num_draft_tokens > engine.num_accepted_tokens > 0  # drafts were verified, some rejected
    greedy = [request_id for request_id in plain_tokens if request_id.endswith("greedy")]
    assert {r: speculated[r] for r in greedy} == {r: plain_tokens[r] for r in greedy}


def test_the_mask_applies_to_the_guided_logits(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint)
    outputs = generate(engine, constrained_params(guidance_scale=3.0, negative_prompt="Answer in prose"))
    check_all(engine, outputs)


def test_a_grammar_dead_end_finishes_the_request_with_its_reason(tiny_checkpoint):
    """After "yes" the grammar allows only EOS, which min_tokens bans: no token is left."""
    engine = tiny_engine(tiny_checkpoint)
    params = SamplingParams(temperature=0.0, max_tokens=10, min_tokens=5, structured_outputs={"choice": ["yes"]})
    neighbour = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    outputs = generate(engine, {"dead": params, "neighbour": neighbour})
    assert outputs["dead"][-1].finish_reason == FinishReason.GRAMMAR_DEAD_END
    assert engine.tokenizer.decode(output_ids(outputs["dead"])) == "yes"
    assert len(output_ids(outputs["neighbour"])) == 10


def test_a_grammar_that_does_not_compile_fails_only_its_request(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint)
    bad = SamplingParams(max_tokens=5, structured_outputs={"json": {"type": "no-such-type"}})
    good = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    outputs = generate(engine, {"bad": bad, "good": good})
    failure = outputs["bad"][-1]
    assert failure.finish_reason == FinishReason.ERROR and failure.error is not None and failure.error.client_fault
    assert "no-such-type" in failure.error.message
    assert len(output_ids(outputs["good"])) == 5


def test_compiled_grammars_are_cached_by_grammar_and_bounded(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint, grammar_cache_size=2)
    for i, regex in enumerate(["a", "a", "b", "c"]):
        engine.add_request(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=2, structured_outputs={"regex": regex}))
        run_until_done(engine)
    assert len(engine.constrained.compiler._cache) == 2


def test_an_abort_while_compiling_leaves_nothing_behind(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint)
    engine.add_request("r", [1, 2, 3], SamplingParams(structured_outputs={"json": SCHEMA}))
    assert engine.num_compiling == 1 and engine.num_waiting == 0  # bounded by the compile budget, not the queue
    engine.abort_requests(["r"])
    outputs = run_until_done(engine)
    assert outputs["r"][-1].finish_reason == FinishReason.ABORT
    assert not engine.constrained.compiling and not engine.has_unfinished_requests()
