"""The Responses API through the ``openai`` SDK and the Messages API through the ``anthropic`` SDK,
against the real app (issue 28, items 1 and 2): streamed and not, with tools and structured outputs;
every streamed event parsed strictly by the SDK's own types; the same greedy text as chat; errors in
each API's shape; behind the key; a client that leaves is aborted."""

from __future__ import annotations

import json
import time

import anthropic
import httpx
import jsonschema
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.responses import Response, ResponseStreamEvent

from tests.e2e.test_disconnects import live_work
from tests.sdk_types import strict

SYSTEM = "You are a helpful assistant."
QUESTION = "What is the capital of France?"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"], "additionalProperties": False}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}, "capital": {"type": "boolean"}}, "required": ["city", "capital"]}
SETTLE_BOUND_S = 30.0
GREEDY = {"temperature": 0.0}
"""Anthropic's API took ``temperature`` (the server still does); this SDK sends it as an extra."""


def anthropic_client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=server.api_key, timeout=120, max_retries=0)


def raw_events(server, path: str, body: dict, headers: dict | None = None) -> list[dict]:
    """A stream's events as sent: each frame's ``event:`` line names its data's type."""
    events = []
    with server.http() as http, http.stream("POST", path, json=body | {"stream": True}, headers=headers or {}) as response:
        assert response.status_code == 200, response.read()
        kind = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: "):
                event = json.loads(line.removeprefix("data: "))
                assert event["type"] == kind, (kind, event)
                events.append(event)
    return events


def test_the_same_greedy_text_through_chat_responses_and_messages(server):
    chat = server.openai().chat.completions.create(
        model=server.model, messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}], max_tokens=16, temperature=0.0
    )
    response = server.openai().responses.create(model=server.model, instructions=SYSTEM, input=QUESTION, max_output_tokens=16, temperature=0.0)
    message = anthropic_client(server).messages.create(
        model=server.model, system=SYSTEM, messages=[{"role": "user", "content": QUESTION}], max_tokens=16, extra_body=GREEDY
    )
    assert response.output_text == message.content[0].text == chat.choices[0].message.content
    assert response.usage.input_tokens == message.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == message.usage.output_tokens == chat.usage.completion_tokens
    counted = anthropic_client(server).messages.count_tokens(model=server.model, system=SYSTEM, messages=[{"role": "user", "content": QUESTION}])
    assert counted.input_tokens == chat.usage.prompt_tokens


def test_responses_stream_parses_strictly_and_equals_the_whole_response(server):
    body = {"model": server.model, "input": QUESTION, "max_output_tokens": 24, "temperature": 0.0}
    whole = strict(Response, server.http().post("/v1/responses", json=body).json())
    events = [strict(ResponseStreamEvent, event) for event in raw_events(server, "/v1/responses", body)]
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text == events[-1].response.output_text
    with server.openai().responses.stream(**body) as stream:  # the SDK's own accumulation of the events
        final = stream.get_final_response()
    assert final.output_text == whole.output_text


@pytest.mark.parametrize("stream", [False, True])
def test_responses_function_tools_and_a_second_turn(server, stream):
    client = server.openai()
    tools = [{"type": "function", "name": "get_weather", "description": "Current weather of a city", "parameters": WEATHER}]
    first = {"model": server.model, "input": "What is the weather in Paris?", "tools": tools, "tool_choice": "required", "max_output_tokens": 48}
    if stream:
        events = [strict(ResponseStreamEvent, event) for event in raw_events(server, "/v1/responses", first)]
        response = events[-1].response
        arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    else:
        response = client.responses.create(**first)
        arguments = None
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather", response
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    assert arguments in (None, calls[0].arguments)
    follow_up = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 24 C"},
    ]
    second = client.responses.create(model=server.model, input=follow_up, tools=tools, max_output_tokens=16, temperature=0.0)
    assert second.status in ("completed", "incomplete") and second.output


def test_responses_text_format_json_schema(server):
    response = server.openai().responses.create(
        model=server.model,
        input="Describe Paris as JSON.",
        text={"format": {"type": "json_schema", "name": "city", "schema": SCHEMA, "strict": True}},
        max_output_tokens=64,
    )
    if response.status == "completed":
        jsonschema.validate(json.loads(response.output_text), SCHEMA)


def test_responses_refuses_what_it_does_not_take(server):
    with server.http() as http:
        for body, param in (({"store": True}, "store"), ({"previous_response_id": "resp_x"}, "previous_response_id"), ({"max_tokens": 3}, "max_tokens")):
            response = http.post("/v1/responses", json={"model": server.model, "input": "Hi"} | body)
            assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text


def test_messages_stream_parses_strictly_and_equals_the_whole_message(server):
    client = anthropic_client(server)
    kwargs = {"model": server.model, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 24}
    whole = client.messages.create(**kwargs, extra_body=GREEDY)
    strict(Message, whole.model_dump(mode="json", exclude_unset=True))
    events = [strict(RawMessageStreamEvent, event) for event in raw_events(server, "/v1/messages", kwargs | GREEDY, {"x-api-key": server.api_key})]
    assert [events[0].type, events[-1].type] == ["message_start", "message_stop"]
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == whole.content[0].text
    with client.messages.stream(**kwargs, extra_body=GREEDY) as stream:  # the SDK's own accumulation of the events
        final = stream.get_final_message()
    assert final.content[0].text == whole.content[0].text and final.stop_reason == whole.stop_reason


@pytest.mark.parametrize("stream", [False, True])
def test_messages_tools_and_a_tool_result_turn(server, stream):
    client = anthropic_client(server)
    tools = [{"name": "get_weather", "description": "Current weather of a city", "input_schema": WEATHER}]
    kwargs = {
        "model": server.model,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": tools,
        "tool_choice": {"type": "any"},
        "max_tokens": 48,
    }
    if stream:
        with client.messages.stream(**kwargs) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**kwargs)
    uses = [block for block in message.content if block.type == "tool_use"]
    assert uses and uses[0].name == "get_weather" and message.stop_reason == "tool_use", message
    jsonschema.validate(uses[0].input, WEATHER)
    follow_up = kwargs["messages"] + [
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in message.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "Sunny, 24 C"}]},
    ]
    second = client.messages.create(model=server.model, messages=follow_up, tools=tools, max_tokens=16, extra_body=GREEDY)
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_messages_stop_sequences_and_errors_in_anthropics_shape(server):
    client = anthropic_client(server)
    full = client.messages.create(model=server.model, messages=[{"role": "user", "content": QUESTION}], max_tokens=16, extra_body=GREEDY)
    words = full.content[0].text.split()
    if len(words) > 2:
        cut = client.messages.create(
            model=server.model, messages=[{"role": "user", "content": QUESTION}], max_tokens=16, extra_body=GREEDY, stop_sequences=[words[2]]
        )
        assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == words[2] and words[2] not in cut.content[0].text
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model=server.model, messages=[{"role": "user", "content": QUESTION}], max_tokens=16, extra_body={"temperature": 1.5})
    assert refused.value.body["type"] == "error" and refused.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.base_url, api_key="wrong", max_retries=0).messages.create(
            model=server.model, messages=[{"role": "user", "content": "x"}], max_tokens=1
        )


def test_messages_output_config_constrains_to_a_schema(server):
    message = anthropic_client(server).messages.create(
        model=server.model,
        messages=[{"role": "user", "content": "Describe Paris as JSON."}],
        max_tokens=64,
        output_config={"format": {"type": "json_schema", "schema": SCHEMA}},
    )
    if message.stop_reason == "end_turn":
        jsonschema.validate(json.loads(message.content[0].text), SCHEMA)


def test_the_new_endpoints_are_behind_the_key_and_in_the_openapi_document(server):
    for path in ("/v1/responses", "/v1/messages", "/v1/messages/count_tokens"):
        assert httpx.post(f"{server.base_url}{path}", json={}, timeout=60).status_code == 401
    with server.http() as http:
        assert {"/v1/responses", "/v1/messages", "/v1/messages/count_tokens"} <= set(http.get("/openapi.json").json()["paths"])


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/responses", {"input": "Count to a thousand."}), ("/v1/messages", {"messages": [{"role": "user", "content": "Count to a thousand."}]})],
)
def test_a_client_that_leaves_is_aborted(server, path, body):
    request = {"model": server.model, "max_output_tokens" if path == "/v1/responses" else "max_tokens": 900, "ignore_eos": True, "stream": True} | body
    if path == "/v1/messages":
        request.pop("ignore_eos")
        request["stop_sequences"] = ["\u2603\u2603"]  # never written: the message runs until the client leaves
    with server.http() as http, http.stream("POST", path, json=request) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if '"delta"' in line:
                break
    deadline = time.monotonic() + SETTLE_BOUND_S
    while (work := live_work(server))["running"] + work["live_choices"] > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert work["running"] == 0 and work["live_choices"] == 0, work
