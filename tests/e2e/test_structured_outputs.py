"""Structured outputs through the openai client: ``response_format`` json_schema on chat and
completions validates against its schema for 20 seeds at temperature 1, streaming and not;
``regex`` and ``choice`` likewise, and ``json_object`` (8 seeds) for each output that ends within its tokens; greedy constrained output is the same with
speculative decoding; a bad schema is a 400 naming its field."""

from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import openai
import pytest

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "population": {"type": "integer", "minimum": 0, "maximum": 100000000},
        "capital": {"type": "boolean"},
    },
    "required": ["city", "population", "capital"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}
MESSAGES = [{"role": "user", "content": "Describe Paris as JSON with its city name, population and whether it is a capital."}]
PROMPT = "Paris as JSON with city, population and capital fields:"
SEEDS = range(20)
MAX_TOKENS = 64
JSON_OBJECT_MAX_TOKENS = 256  # any object: at temperature 1 the default model may write one longer than this
JSON_OBJECT_SEEDS = range(8)  # each may run its 256 tokens: the suite's slowest e2e test with 20
REGEX = r"[0-9]{3}-[0-9]{4}"
CHOICES = ["Paris", "London", "Berlin"]
WAIT_S = 600


async def chat_text(client: openai.AsyncOpenAI, model: str, stream: bool, **kwargs) -> tuple[str, str]:
    """(text, finish reason) of one chat completion, joined from its chunks when streamed."""
    if not stream:
        response = await client.chat.completions.create(model=model, messages=MESSAGES, **({"max_tokens": MAX_TOKENS} | kwargs))
        return response.choices[0].message.content or "", response.choices[0].finish_reason
    text, finish = "", ""
    async for chunk in await client.chat.completions.create(model=model, messages=MESSAGES, stream=True, **({"max_tokens": MAX_TOKENS} | kwargs)):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return text, finish


async def completion_text(client: openai.AsyncOpenAI, model: str, stream: bool, **kwargs) -> tuple[str, str]:
    if "response_format" in kwargs:  # the client's completions take it only as an extra body field
        kwargs["extra_body"] = kwargs.get("extra_body", {}) | {"response_format": kwargs.pop("response_format")}
    if not stream:
        response = await client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, **kwargs)
        return response.choices[0].text, response.choices[0].finish_reason
    text, finish = "", ""
    async for chunk in await client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, stream=True, **kwargs):
        for choice in chunk.choices:
            text += choice.text
            finish = choice.finish_reason or finish
    return text, finish


def run_seeds(server, create, stream: bool, seeds: range = SEEDS, **kwargs) -> list[tuple[str, str]]:
    """One request per seed at temperature 1, all at once."""

    async def run() -> list[tuple[str, str]]:
        client = server.async_openai()
        calls = [create(client, server.model, stream, temperature=1.0, seed=seed, **kwargs) for seed in seeds]
        return await asyncio.wait_for(asyncio.gather(*calls), WAIT_S)

    return asyncio.run(run())


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("create", [chat_text, completion_text], ids=["chat", "completions"])
def test_json_schema_outputs_validate_for_20_seeds(server, create, stream):
    for text, finish in run_seeds(server, create, stream, response_format=RESPONSE_FORMAT):
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("stream", [False, True])
def test_json_object_regex_and_choice(server, stream):
    objects = run_seeds(server, chat_text, stream, JSON_OBJECT_SEEDS, response_format={"type": "json_object"}, max_tokens=JSON_OBJECT_MAX_TOKENS)
    finished = [text for text, finish in objects if finish == "stop"]
    assert len(finished) >= len(objects) // 2  # the others ran out of tokens inside the object
    for text in finished:
        assert isinstance(json.loads(text), dict), text
    for text, _ in run_seeds(server, completion_text, stream, extra_body={"structured_outputs": {"regex": REGEX}}):
        assert re.fullmatch(REGEX, text), text
    for text, _ in run_seeds(server, chat_text, stream, extra_body={"structured_outputs": {"choice": CHOICES}}):
        assert text in CHOICES, text


def test_greedy_constrained_output_is_the_same_with_speculation(server):
    client = server.openai()
    outputs = [
        client.chat.completions.create(
            model=server.model, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0.0, response_format=RESPONSE_FORMAT, extra_body=extra
        )
        for extra in ({}, {"num_speculative_tokens": 4, "prompt_lookup_min": 1})
    ]
    plain, speculated = (output.choices[0].message.content for output in outputs)
    jsonschema.validate(json.loads(plain or ""), SCHEMA)
    assert speculated == plain
    details = outputs[1].usage.completion_tokens_details  # present only when tokens were drafted
    assert details is not None and details.accepted_prediction_tokens + details.rejected_prediction_tokens > 0


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}}, "response_format"),
        ({"extra_body": {"structured_outputs": {"regex": "a(b"}}}, "structured_outputs"),
        ({"extra_body": {"structured_outputs": {"grammar": "start: undefined_rule"}}}, "structured_outputs"),
    ],
)
def test_a_bad_constraint_is_a_400_naming_its_field(server, kwargs, param):
    with pytest.raises(openai.BadRequestError) as caught:
        server.openai().chat.completions.create(model=server.model, messages=MESSAGES, max_tokens=4, **kwargs)
    assert caught.value.body["param"] == param  # type: ignore[index]
