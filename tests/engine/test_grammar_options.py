"""vLLM's structured-output options, as the compiled grammar holds them: ``disable_any_whitespace``,
``whitespace_pattern``, ``disable_additional_properties`` and ``structural_tag`` (issue 28)."""

from __future__ import annotations

import json

import llguidance
import pytest
from pydantic import ValidationError

from engine.grammar.limits import GrammarLimits
from engine.grammar.spec import grammar_error, grammar_text
from sampling.structured_outputs import StructuredOutputs
from tests.engine.test_chat_tokenizer import TOKENIZER

OBJECT = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TAG = {
    "type": "structural_tag",
    "structures": [
        {"begin": "<function=add>", "schema": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}, "end": "</function>"}
    ],
    "triggers": ["<function="],
}
LLG_TOKENIZER = llguidance.LLTokenizer(TOKENIZER.tokenizer.to_str(), n_vocab=TOKENIZER.vocab_size, eos_token=list(TOKENIZER.eos_token_ids))


def accepts(constraint: StructuredOutputs, text: str) -> bool:
    """Whether the constraint's grammar takes ``text`` whole, and may stop there."""
    matcher = llguidance.LLMatcher(LLG_TOKENIZER, grammar_text(constraint))
    ids = TOKENIZER.encode(text, add_special_tokens=False)
    return matcher.validate_tokens(ids) == len(ids) and matcher.consume_tokens(ids) and matcher.is_accepting()


@pytest.mark.parametrize(
    ("options", "compact", "spaced", "newline"),
    [
        ({}, True, False, False),  # Spout's default: compact JSON
        ({"disable_any_whitespace": True}, True, False, False),
        ({"disable_any_whitespace": False}, True, True, True),  # vLLM's default: any whitespace
        ({"whitespace_pattern": "[ ]?"}, True, True, False),
    ],
)
def test_whitespace_options(options, compact, spaced, newline):
    constraint = StructuredOutputs(json=OBJECT, **options)
    assert accepts(constraint, '{"a":1}') is compact
    assert accepts(constraint, '{"a": 1}') is spaced
    assert accepts(constraint, '{\n"a":1}') is newline


def test_disable_additional_properties_closes_every_object_that_does_not_say():
    nested = {"type": "object", "properties": {"inner": OBJECT, "open": {"type": "object", "properties": {}, "additionalProperties": True}}}
    loose, closed = StructuredOutputs(json=nested), StructuredOutputs(json=nested, disable_additional_properties=True)
    extra_inside = '{"inner":{"a":1,"b":2}}'
    assert accepts(loose, extra_inside) and not accepts(closed, extra_inside)
    assert accepts(closed, '{"inner":{"a":1},"open":{"z":3}}')  # said so: kept open
    assert not accepts(closed, '{"other":1}')


@pytest.mark.parametrize("as_text", [True, False])
def test_structural_tag_constrains_only_what_a_trigger_starts(as_text):
    constraint = StructuredOutputs(structural_tag=json.dumps(TAG) if as_text else TAG)
    assert accepts(constraint, "Let me add. ")
    assert accepts(constraint, 'Sure: <function=add>{"x":2}</function> done')
    assert not accepts(constraint, 'Sure: <function=add>{"y":2}</function>')
    assert grammar_error(constraint, GrammarLimits()) is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"regex": "a", "disable_any_whitespace": True}, "JSON output only"),
        ({"choice": ["a"], "whitespace_pattern": " "}, "JSON output only"),
        ({"json": OBJECT, "whitespace_pattern": " ", "disable_any_whitespace": True}, "give one of the two"),
        ({"structural_tag": TAG | {"triggers": ["<tool>"]}}, "no trigger starts"),
        ({"structural_tag": "{not json"}, "not valid JSON"),
        ({"json": OBJECT, "structural_tag": TAG}, "exactly one"),
    ],
)
def test_options_that_do_not_fit_are_refused(fields, message):
    with pytest.raises(ValidationError, match=message):
        StructuredOutputs(**fields)


def test_the_options_are_part_of_the_compile_key_and_the_size():
    plain = StructuredOutputs(json=OBJECT)
    assert len({plain.key, StructuredOutputs(json=OBJECT, disable_any_whitespace=False).key, StructuredOutputs(json=OBJECT, whitespace_pattern=" ").key}) == 3
    assert StructuredOutputs(json=OBJECT, whitespace_pattern=" " * 100).text_size() == plain.text_size() + 100
    assert StructuredOutputs(structural_tag=TAG).text_size() > len(json.dumps(TAG["structures"][0]["schema"]))


def test_a_trigger_written_like_a_special_token_is_text():
    """llguidance would read ``<city>`` as a special token's name; here triggers are text."""
    tag = {"structures": [{"begin": "<city>", "schema": {"type": "string"}, "end": "</city>"}], "triggers": ["<city>"]}
    constraint = StructuredOutputs(structural_tag=tag)
    assert grammar_error(constraint, GrammarLimits()) is None
    assert accepts(constraint, 'It is <city>"Paris"</city>.') and not accepts(constraint, "It is <city>Paris</city>.")


@pytest.mark.parametrize("fields", [{"json": OBJECT}, {"regex": "[0-9]{3}"}, {"choice": ["yes", "no"]}, {"grammar": 'start: "a"+'}, {"structural_tag": TAG}])
def test_with_reasoning_end_the_constraint_applies_after_the_thinking(fields):
    answers = {"json": '{"a":1}', "regex": "123", "choice": "no", "grammar": "aaa", "structural_tag": 'x <function=add>{"x":1}</function>'}
    answer = answers[next(iter(fields))]
    thinking = StructuredOutputs(**fields, reasoning_end="</think>")
    assert grammar_error(thinking, GrammarLimits()) is None
    assert accepts(thinking, f"<think>Any text, {{not JSON</think>{answer}")
    assert accepts(thinking, f"Any text</think>{answer}")
    if "structural_tag" not in fields:  # a structural tag's text after its tags is free
        assert not accepts(thinking, f"<think>a</think>{answer}</think>")
    assert not accepts(thinking, answer)  # the thinking must end first
    assert accepts(StructuredOutputs(**fields), answer)


def test_an_engine_runs_a_constraint_that_waits_for_the_thinking_to_end(tiny_checkpoint):
    """The engine compiles and steps such a grammar: the tiny random model writes no ``</think>`` in
    its few tokens, so every token stays free, and the request ends as its length allows."""
    from engine.outputs import FinishReason
    from sampling.params import SamplingParams
    from tests.engine.conftest import run_until_done
    from tests.engine.test_grammar_limits import PROMPT, tiny_engine

    engine = tiny_engine(tiny_checkpoint)
    constraint = {"regex": "[0-9]{3}", "reasoning_end": "</think>"}
    engine.add_request("r", PROMPT, SamplingParams(temperature=1.0, seed=3, max_tokens=6, structured_outputs=constraint))
    outputs = run_until_done(engine)
    assert outputs["r"][-1].finish_reason == FinishReason.LENGTH
