"""Tool calling through the openai client: the default model, whose template knows nothing of
tools, gets them by the generic fallback; three worked examples in the conversation make it
call the tool greedily in the <tool_call> format, which tool_choice "auto" parses."""

from __future__ import annotations

import json

import openai
import pytest

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def worked_example(index: int, city: str, weather: str) -> list[dict]:
    call = {"id": f"call_{index}", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}
    return [
        {"role": "user", "content": f"What is the weather in {city}?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"call_{index}", "content": weather},
        {"role": "assistant", "content": f"It is {weather} in {city}."},
    ]


MESSAGES = [
    *worked_example(1, "Paris", "sunny"),
    *worked_example(2, "Berlin", "rainy"),
    *worked_example(3, "Rome", "hot"),
    {"role": "user", "content": "What is the weather in London?"},
]
REQUEST = {"messages": MESSAGES, "tools": [WEATHER], "temperature": 0.0, "max_tokens": 48}


def test_auto_returns_the_models_call(server):
    response = server.openai().chat.completions.create(model=server.model, **REQUEST)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "London"}
    assert "<tool_call>" not in (choice.message.content or "")


def test_streamed_call_fragments_join_into_the_whole_call(server):
    client = server.openai()
    whole = client.chat.completions.create(model=server.model, **REQUEST).choices[0]
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(model=server.model, stream=True, **REQUEST):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for fragment in choice.delta.tool_calls or []:
                call = calls.setdefault(fragment.index, {"id": None, "type": None, "name": "", "arguments": ""})
                call["id"] = fragment.id or call["id"]
                call["type"] = fragment.type or call["type"]
                call["name"] += fragment.function.name or ""
                call["arguments"] += fragment.function.arguments or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls" and content == (whole.message.content or "")
    assert [(c["type"], c["name"], c["arguments"]) for c in calls.values()] == [
        (c.type, c.function.name, c.function.arguments) for c in whole.message.tool_calls
    ]
    assert all(c["id"].startswith("call_") for c in calls.values())


def test_tool_choice_none_offers_no_tools_and_parses_nothing(server):
    response = server.openai().chat.completions.create(model=server.model, tool_choice="none", **REQUEST)
    assert response.choices[0].message.tool_calls is None and response.choices[0].finish_reason != "tool_calls"


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
@pytest.mark.parametrize("stream", [False, True])
def test_required_and_named_tool_choice_constrain_the_output_to_a_call(server, tool_choice, stream):
    """The grammar engine makes the model call the tool, whatever it would have written, at any temperature."""
    request = {
        **REQUEST,
        "messages": [{"role": "user", "content": "Tell me a joke."}],
        "temperature": 1.0,
        "seed": 7,
        "max_tokens": 96,
        "parallel_tool_calls": False,
    }
    client = server.openai()
    if stream:
        names, arguments, finish = "", "", None
        for chunk in client.chat.completions.create(model=server.model, tool_choice=tool_choice, stream=True, **request):
            for choice in chunk.choices:
                for fragment in choice.delta.tool_calls or []:
                    names += fragment.function.name or ""
                    arguments += fragment.function.arguments or ""
                finish = choice.finish_reason or finish
    else:
        choice = client.chat.completions.create(model=server.model, tool_choice=tool_choice, **request).choices[0]
        (call,) = choice.message.tool_calls
        names, arguments, finish = call.function.name, call.function.arguments, choice.finish_reason
    assert finish == "tool_calls" and names == "get_weather"
    assert isinstance(json.loads(arguments)["city"], str)


def test_constrained_tool_choice_with_a_response_format_is_a_400(server):
    with pytest.raises(openai.BadRequestError) as refused:
        server.openai().chat.completions.create(model=server.model, tool_choice="required", response_format={"type": "json_object"}, **REQUEST)
    assert refused.value.body["param"] == "tool_choice"


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
        ({"messages": [{"role": "tool", "content": "no id"}]}, "messages"),
    ],
)
def test_bad_tool_fields_are_a_400_naming_the_field(server, fields, param):
    with pytest.raises(openai.BadRequestError) as refused:
        server.openai().chat.completions.create(model=server.model, **{**REQUEST, **fields})
    assert refused.value.body["param"] == param


OPEN_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
"""``{"city": string}`` with any other property allowed: the default model forced to call it keeps adding properties."""


def streamed_calls(chunks) -> tuple[list[dict], str | None, int, str]:
    """The calls joined from a stream's pieces, its finish reason, how many pieces carried arguments, and its content."""
    calls, finish, pieces, content = {}, None, 0, ""
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for piece in choice.delta.tool_calls or []:
                call = calls.setdefault(piece.index, {"id": piece.id, "name": piece.function.name, "arguments": ""})
                call["arguments"] += piece.function.arguments or ""
                pieces += bool(piece.function.arguments)
            finish = choice.finish_reason or finish
    return [calls[i] for i in sorted(calls)], finish, pieces, content


@pytest.mark.parametrize("max_tokens", [80, 300])
@pytest.mark.parametrize("tool_choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"], ids=["named", "required"])
def test_a_forced_call_at_max_tokens_comes_back_as_a_call(server, tool_choice, max_tokens):
    """The issue's case: the call is what was generated, streamed piece by piece, and finish_reason says why it ended."""
    request = {
        "messages": [{"role": "user", "content": "What is the weather in Oslo?"}],
        "tools": [OPEN_WEATHER],
        "tool_choice": tool_choice,
        "temperature": 0.0,
        "max_tokens": max_tokens,
        "parallel_tool_calls": False,
    }
    client = server.openai().with_options(timeout=600)  # 300 tokens on a busy CPU
    whole = client.chat.completions.create(model=server.model, **request)
    choice = whole.choices[0]
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_") and not choice.message.content
    assert choice.finish_reason in ("length", "tool_calls")
    if choice.finish_reason == "length":
        assert whole.usage.completion_tokens == max_tokens
    else:
        json.loads(call.function.arguments)
    assert call.function.arguments.startswith("{")  # "city" is not required: the model may write other properties first
    calls, finish, pieces, content = streamed_calls(client.chat.completions.create(model=server.model, stream=True, **request))
    assert finish == choice.finish_reason and content == ""
    assert [(c["name"], c["arguments"]) for c in calls] == [("get_weather", call.function.arguments)]
    assert calls[0]["id"].startswith("call_")
    assert pieces > 1  # streamed as generated, not in one piece at the end
