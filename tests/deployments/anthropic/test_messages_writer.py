"""The Messages API's writer, from deltas as the engine client gives them: every streamed event and
the whole message parse strictly as the ``anthropic`` SDK's own types; streamed and whole agree;
stop reasons; tool_use blocks; an error event midway. Plus the request's translation into a chat."""

from __future__ import annotations

import asyncio
import json

import pytest
from anthropic.types import Message, RawMessageStreamEvent

from deployments.anthropic.messages_request import MessagesRequest
from deployments.anthropic.messages_writer import MessageBuilder, MessageFrames, message_body
from deployments.openai.errors import APIError
from deployments.openai.output_events import stream_frames
from deployments.openai.tool_calls import tool_call_output
from tests.deployments.openai.test_responses_writer import delta, deltas_of, events_of
from tests.sdk_types import strict

TOOLS = [{"name": "get_weather", "description": "Weather of a city", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]


def request(**fields) -> MessagesRequest:
    return MessagesRequest.model_validate({"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]} | fields)


def run(body: MessagesRequest, steps, error: APIError | None = None):
    calls = tool_call_output(body.chat_request(), "hermes", 4096)

    async def both():
        streamed = [f async for f in stream_frames(MessageFrames(MessageBuilder("msg_1", "m", 5), calls), deltas_of(steps, error))]
        whole = None if error else await message_body(MessageBuilder("msg_1", "m", 5), calls, deltas_of(steps))
        return events_of(streamed), whole

    return asyncio.run(both())


@pytest.mark.parametrize(
    ("finish", "stop", "reason", "sequence"),
    [("stop", None, "end_turn", None), ("length", None, "max_tokens", None), ("stop", "END", "stop_sequence", "END"), ("stop", 42, "end_turn", None)],
)
def test_text_streams_as_the_sdk_parses_it_and_equals_the_whole_message(finish, stop, reason, sequence):
    events, whole = run(request(), [delta("Hel"), delta("lo", 2), delta("!", 1, finish, stop)])
    parsed = [strict(RawMessageStreamEvent, event) for event in events]
    assert [e.type for e in parsed] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    message = strict(Message, whole)
    assert message.content[0].text == "Hello!" and (message.stop_reason, message.stop_sequence) == (reason, sequence)
    assert parsed[-2].delta.stop_reason == reason and parsed[-2].usage.output_tokens == message.usage.output_tokens == 4
    assert message.usage.input_tokens == 5 == parsed[0].message.usage.input_tokens


def test_tool_calls_become_tool_use_blocks():
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    events, whole = run(request(tools=TOOLS), [delta("Checking. "), delta(call[:30]), delta(call[30:], 5, "stop")])
    for event in events:
        strict(RawMessageStreamEvent, event)
    message = strict(Message, whole)
    text, tool_use = message.content
    assert text.text == "Checking. " and tool_use.type == "tool_use" and tool_use.name == "get_weather" and tool_use.input == {"city": "Paris"}
    assert message.stop_reason == "tool_use"
    partial = "".join(e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta")
    assert json.loads(partial) == {"city": "Paris"}


def test_a_failure_midway_ends_the_stream_with_an_error_event():
    events, _ = run(request(), [delta("Hel")], error=APIError(500, "engine died"))
    assert events[-1] == {"type": "error", "error": {"type": "api_error", "message": "engine died"}}


def test_blocks_become_the_chat_they_mean():
    body = request(
        system=[{"type": "text", "text": "Be brief."}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "Checking."}, {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}, {"type": "text", "text": "So?"}]},
        ],
        tools=TOOLS,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        stop_sequences=["END"],
        top_k=5,
    )
    chat = body.chat_request()
    assert [m.role for m in chat.messages] == ["system", "user", "assistant", "tool", "user"]
    assert chat.messages[2].tool_calls[0].id == "toolu_1" and json.loads(chat.messages[2].tool_calls[0].function.arguments) == {"city": "Paris"}
    assert chat.messages[3].tool_call_id == "toolu_1" and chat.tool_choice == "required" and not chat.parallel_tool_calls
    params = chat.sampling_params()
    assert params.stop == ["END"] and params.top_k == 5 and params.max_tokens == 16


@pytest.mark.parametrize(
    "fields",
    [
        {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
        {"thinking": {"type": "enabled", "budget_tokens": 1024}},
        {"temperature": 1.5},
        {"tool_choice": {"type": "tool"}},
        {"unknown": 1},
    ],
)
def test_what_the_messages_api_does_not_take_is_refused(fields):
    with pytest.raises(Exception):  # noqa: B017 - a ValidationError or an APIError, both 400s at the ingress
        request(**fields).chat_request()
