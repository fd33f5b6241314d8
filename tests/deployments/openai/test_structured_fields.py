"""``response_format`` and ``structured_outputs`` on chat and completions: each becomes the request's
`StructuredOutputs`; a malformed or conflicting one is a 400 naming its field; its size is bounded."""

from __future__ import annotations

import asyncio

import pytest

from deployments.limits import RequestLimits, check_structured_outputs
from deployments.openai.errors import APIError
from deployments.openai.protocol import ChatCompletionRequest, CompletionRequest
from deployments.prompt_encoder import PromptEncoder
from engine.grammar.limits import GrammarLimits
from engine.loader.model_files import load_tokenizer
from sampling.structured_outputs import StructuredOutputs, json_schema_output

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
MESSAGES = [{"role": "user", "content": "hi"}]


def chat(**fields: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": MESSAGES} | fields)


def completion(**fields: object) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "m", "prompt": "hi"} | fields)


@pytest.mark.parametrize("request_of", [chat, completion])
def test_response_format_becomes_structured_outputs(request_of):
    json_schema = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}}
    body = request_of(response_format=json_schema)
    assert body.sampling_params().structured_outputs == json_schema_output(SCHEMA)
    assert body.structured_param == "response_format"
    assert request_of(response_format={"type": "json_object"}).sampling_params().structured_outputs == StructuredOutputs(json_object=True)
    assert request_of(response_format={"type": "text"}).sampling_params().structured_outputs is None


@pytest.mark.parametrize(
    "extra",
    [{"json": SCHEMA}, {"json": '{"type": "string"}'}, {"regex": "[a-z]+"}, {"choice": ["yes", "no"]}, {"grammar": 'start: "a"+'}],
)
def test_vllm_structured_outputs_is_taken_as_given(extra):
    body = completion(structured_outputs=extra)
    assert body.sampling_params().structured_outputs is not None
    assert body.structured_param == "structured_outputs"


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": {"json": "{not json"}}, "structured_outputs"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs"),
        ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "response_format"),
    ],
)
def test_malformed_constraints_are_400_naming_the_field(fields, param):
    with pytest.raises((APIError, ValueError)) as caught:
        chat(**fields).sampling_params()
    error = caught.value
    if not isinstance(error, APIError):  # the body model itself refused it (the ingress answers with its field)
        assert param in str(error)
        return
    assert error.status == 400 and error.param == param


def test_the_constraint_size_is_bounded_by_its_limit():
    limits = RequestLimits(max_structured_output_bytes=20)
    params = completion(structured_outputs={"regex": "x" * 20}).sampling_params()
    check_structured_outputs(limits, params, "structured_outputs")
    params = completion(structured_outputs={"regex": "x" * 21}).sampling_params()
    with pytest.raises(APIError) as caught:
        check_structured_outputs(limits, params, "structured_outputs")
    assert caught.value.param == "structured_outputs" and "max_structured_output_bytes" in caught.value.message


@pytest.mark.parametrize(
    "constraint, fragment",
    [({"json": {"type": "no-such-type"}}, "no-such-type"), ({"regex": "a(b"}, "unclosed group"), ({"grammar": "start: undefined_rule"}, "unknown name")],
)
def test_a_constraint_that_does_not_compile_says_why_on_the_encoder_pool(constraint, fragment):
    encoder = PromptEncoder(load_tokenizer("tiny-random"))
    assert fragment in (asyncio.run(encoder.grammar_error(StructuredOutputs.model_validate(constraint), GrammarLimits())) or "")
    for good in (StructuredOutputs(json=SCHEMA), StructuredOutputs(json=True), StructuredOutputs(grammar='root ::= "a" | "b"')):
        assert asyncio.run(encoder.grammar_error(good, GrammarLimits())) is None
