"""The Responses API's writer, from deltas as the engine client gives them: every streamed event
and the whole response parse strictly as the ``openai`` SDK's own types; streamed and whole agree;
tool calls become function_call items; a cut response is incomplete; a failure ends the stream
with response.failed. Plus the request's translation into a chat."""

from __future__ import annotations

import asyncio
import json

import pytest
from openai.types.responses import Response, ResponseStreamEvent

from deployments.openai.errors import APIError
from deployments.openai.output_events import ChoiceDelta, stream_frames
from deployments.openai.protocol import ChatCompletionRequest
from deployments.openai.responses_request import ResponsesRequest
from deployments.openai.responses_writer import ResponseBuilder, ResponseFrames, response_body
from deployments.openai.tool_calls import tool_call_output
from tests.sdk_types import strict

TOOLS = [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]


async def deltas_of(steps: list[dict[int, ChoiceDelta]], error: APIError | None = None):
    for step in steps:
        yield step
    if error is not None:
        raise error


def delta(text: str, tokens: int = 1, finish: str | None = None, stop: int | str | None = None) -> dict[int, ChoiceDelta]:
    return {0: ChoiceDelta(text=text, token_ids=[7] * tokens, finish_reason=finish, stop_reason=stop)}


def request(**fields) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", "input": "Hi"} | fields)


def events_of(frames: list[str]) -> list[dict]:
    events = []
    for frame in "".join(frames).split("\n\n")[:-1]:
        kind, data = frame.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {event['type']}"
        events.append(event)
    return events


def run(body: ResponsesRequest, steps, error: APIError | None = None, parser: str = "hermes"):
    calls = tool_call_output(body.chat_request(), parser, 4096)

    async def both():
        streamed = [f async for f in stream_frames(ResponseFrames(ResponseBuilder("resp_1", "m", body.echo_fields(), 5), calls), deltas_of(steps, error))]
        whole = None if error else await response_body(ResponseBuilder("resp_1", "m", body.echo_fields(), 5), calls, deltas_of(steps))
        return events_of(streamed), whole

    return asyncio.run(both())


def test_text_streams_as_the_sdk_parses_it_and_equals_the_whole_response():
    events, whole = run(request(), [delta("Hel"), delta("lo", 2), delta("!", 1, "stop")])
    parsed = [strict(ResponseStreamEvent, event) for event in events]
    kinds = [event.type for event in parsed]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in parsed] == list(range(len(parsed)))
    final = strict(Response, whole)
    assert final.output_text == "Hello!" == parsed[-1].response.output_text
    assert final.status == "completed" and final.usage.input_tokens == 5 and final.usage.output_tokens == 4
    assert whole["output"][0]["content"] == events[-1]["response"]["output"][0]["content"]


def test_a_cut_response_is_incomplete():
    events, whole = run(request(max_output_tokens=2), [delta("Hel", 2, "length")])
    assert events[-1]["type"] == "response.incomplete"
    final = strict(Response, whole)
    assert final.status == "incomplete" and final.incomplete_details.reason == "max_output_tokens" and final.output[0].status == "incomplete"


def test_tool_calls_become_function_call_items():
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    events, whole = run(request(tools=TOOLS), [delta("Let me check. "), delta(call[:30]), delta(call[30:], 5, "stop")])
    for event in events:
        strict(ResponseStreamEvent, event)
    final = strict(Response, whole)
    message, function_call = final.output
    assert message.type == "message" and message.content[0].text == "Let me check. "
    assert function_call.type == "function_call" and function_call.name == "get_weather" and json.loads(function_call.arguments) == {"city": "Paris"}
    arguments = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert arguments == function_call.arguments
    assert [e["type"] for e in events].count("response.output_item.done") == 2


def test_a_failure_midway_ends_the_stream_with_response_failed():
    events, _ = run(request(), [delta("Hel")], error=APIError(500, "engine died"))
    failed = strict(ResponseStreamEvent, events[-1])
    assert failed.type == "response.failed" and failed.response.error.message == "engine died"


def test_input_items_become_the_chat_they_mean():
    body = request(
        instructions="Be brief.",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        ],
        tools=TOOLS,
        tool_choice={"type": "function", "name": "get_weather"},
        text={"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
        max_output_tokens=9,
        top_k=3,
    )
    chat = body.chat_request()
    assert isinstance(chat, ChatCompletionRequest)
    assert [m.role for m in chat.messages] == ["system", "user", "assistant", "tool"]
    assert chat.messages[2].tool_calls[0].id == "call_1" and chat.messages[3].tool_call_id == "call_1"
    assert chat.tool_choice.function.name == "get_weather" and chat.tools[0].function.name == "get_weather"
    params = chat.sampling_params()
    assert params.max_tokens == 9 and params.top_k == 3 and params.structured_outputs.json_ == {"type": "object"}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"store": True}, "store"),
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"truncation": "auto"}, "truncation"),
        ({"max_tokens": 4}, "max_tokens"),
        ({"n": 2}, "n"),
        ({"input": []}, "input"),
    ],
)
def test_what_the_responses_api_does_not_take_is_a_400_naming_it(fields, param):
    with pytest.raises(APIError) as refused:
        request(**fields).chat_request()
    assert refused.value.status == 400 and refused.value.param == param
