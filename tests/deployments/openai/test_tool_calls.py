"""``tools`` and ``tool_choice`` in a chat request: validation, the schema "required" and a
named function constrain the output to, and each choice's calls and finish reason."""

from __future__ import annotations

import json

import jsonschema
import pytest

from deployments.openai.errors import APIError
from deployments.openai.protocol import ChatCompletionRequest
from deployments.openai.responses import ResponseFormat
from deployments.openai.tool_calls import ChoiceToolCalls, tool_call_output, tool_call_schema
from deployments.openai.tools import ToolCall, ToolCallDelta

WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
}
ADD = {"type": "function", "function": {"name": "add"}}
USER = [{"role": "user", "content": "Hi"}]
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", **{"messages": USER, **fields})


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
    ],
)
def test_inconsistent_tools_are_a_400_naming_the_field(fields, param):
    with pytest.raises(APIError) as refused:
        chat(**fields)
    assert (refused.value.status, refused.value.param) == (400, param)


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "tool", "content": "no id"}],
        [{"role": "user", "content": "x", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}],
    ],
)
def test_malformed_tool_messages_are_refused(messages):
    with pytest.raises(ValueError, match="tool"):
        chat(messages=messages)


def test_tool_choice_defaults_to_auto_with_tools_and_none_without():
    assert chat(tools=[WEATHER]).effective_tool_choice == "auto"
    assert chat().effective_tool_choice == "none"
    assert tool_call_output(chat(tools=[WEATHER], tool_choice="none"), "hermes", 1024) is None
    assert tool_call_output(chat(tools=[WEATHER]), "hermes", 1024).parser_name == "hermes"


def test_a_named_function_constrains_the_output_to_its_parameters():
    body = chat(tools=[WEATHER, ADD], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    schema = tool_call_schema(body)
    jsonschema.validate({"city": "Oslo"}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"town": "Oslo"}, schema)
    calls = ChoiceToolCalls(tool_call_output(body, "hermes", 1024))
    assert calls.feed('{"city": "Oslo"}', finished=True)[1][0].function.name == "get_weather"


@pytest.mark.parametrize("parallel, valid_lengths", [(True, [1, 2]), (False, [1])])
def test_required_constrains_the_output_to_an_array_of_calls(parallel, valid_lengths):
    body = chat(tools=[WEATHER, ADD], tool_choice="required", parallel_tool_calls=parallel)
    schema = tool_call_schema(body)
    call = {"name": "get_weather", "arguments": {"city": "Oslo"}}
    for length in (0, 1, 2):
        valid = length in valid_lengths
        try:
            jsonschema.validate([call] * length, schema)
        except jsonschema.ValidationError:
            assert not valid
        else:
            assert valid
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "add", "arguments": {}, "extra": 1}], schema)
    assert tool_call_schema(chat(tools=[WEATHER])) is None


def test_a_choice_with_calls_that_stopped_finishes_with_tool_calls():
    calls = ChoiceToolCalls(tool_call_output(chat(tools=[WEATHER]), "hermes", 1024))
    content, new = calls.feed("Sure. " + CALL, finished=False)
    assert content == "Sure. " and [(c.index, c.function.name, json.loads(c.function.arguments)) for c in new] == [(0, "get_weather", {"city": "Oslo"})]
    assert calls.feed(CALL, finished=True)[1][0].index == 1  # the second call's index
    assert (calls.finish_reason("stop"), calls.finish_reason("length")) == ("tool_calls", "length")
    assert ChoiceToolCalls(tool_call_output(chat(tools=[WEATHER]), "hermes", 1024)).finish_reason("stop") == "stop"


def test_without_parallel_calls_only_the_first_is_kept():
    calls = ChoiceToolCalls(tool_call_output(chat(tools=[WEATHER], parallel_tool_calls=False), "hermes", 1024))
    assert len(calls.feed(CALL + CALL, finished=False)[1]) == 1
    assert calls.feed(CALL, finished=True)[1] == []


def test_calls_in_chunks_and_in_the_whole_response():
    fmt = ResponseFormat.new("chatcmpl-1", "m", chat=True)
    call = ToolCall.new("get_weather", '{"city": "Oslo"}')
    chunk = fmt.chunk_choice(0, "", None, None, tool_calls=[ToolCallDelta.opening(0, call)])
    assert chunk["delta"]["tool_calls"] == [
        {"index": 0, "id": call.id, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    ]
    more = fmt.chunk_choice(0, "", "tool_calls", None, tool_calls=[ToolCallDelta.more_arguments(0, "}")])
    assert more["delta"]["tool_calls"] == [{"index": 0, "function": {"arguments": "}"}}]
    message = fmt.full_choice(0, "", "tool_calls", None, None, [call])["message"]
    assert message == {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]}
    assert fmt.full_choice(0, "hi", "stop", None, None)["message"] == {"role": "assistant", "content": "hi"}


@pytest.mark.parametrize(
    "tool_choice, output",
    [
        ({"type": "function", "function": {"name": "get_weather"}}, '{"city":"Oslo","extra_1":"a","extra_2":"b'),
        ("required", '[{"name":"get_weather","arguments":{"city":"Oslo","extra_1":"a","extra_2":"b'),
    ],
)
def test_a_forced_call_cut_by_the_length_limit_is_a_call_that_says_so(tool_choice, output):
    """The pieces streamed join into the call the whole response has, and the choice finishes with "length"."""
    body = chat(tools=[WEATHER, ADD], tool_choice=tool_choice)
    streamed = ChoiceToolCalls(tool_call_output(body, "hermes", 1024))
    pieces = [streamed.feed(output[i : i + 5], finished=i + 5 >= len(output)) for i in range(0, len(output), 5)]
    assert "".join(content for content, _ in pieces) == ""
    deltas = [delta for _, ds in pieces for delta in ds]
    assert [d.function.name for d in deltas if d.id is not None] == ["get_weather"]
    assert "".join(d.function.arguments for d in deltas) == '{"city":"Oslo","extra_1":"a","extra_2":"b'
    whole = ChoiceToolCalls(tool_call_output(body, "hermes", 1024))
    assert whole.feed(output, finished=True)[0] == ""
    assert [(c.function.name, c.function.arguments) for c in whole.calls] == [(c.function.name, c.function.arguments) for c in streamed.calls]
    assert streamed.calls[0].id == deltas[0].id
    assert (whole.finish_reason("length"), whole.finish_reason("stop")) == ("length", "tool_calls")
