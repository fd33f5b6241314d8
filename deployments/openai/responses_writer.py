"""The Responses API's answers, written from the one event model (`deployments.openai.output_events`).

`ResponseBuilder` turns a choice's events into the output items and the typed stream events the
``openai`` SDK parses: ``response.created`` and ``response.in_progress``; per message
``response.output_item.added``, ``response.content_part.added``, ``response.output_text.delta``...,
``response.output_text.done``, ``response.content_part.done``, ``response.output_item.done``; per
function call ``response.output_item.added``, ``response.function_call_arguments.delta``...,
``response.function_call_arguments.done``, ``response.output_item.done``; then
``response.completed`` (``response.incomplete`` when ``max_output_tokens`` cut it, with
``incomplete_details.reason: "max_output_tokens"``), or ``response.failed`` when the request
fails midway. A streamed and a whole response are built by the same builder, so they agree.
"""

from __future__ import annotations

import json
import secrets
import time
from contextlib import aclosing
from typing import Any

from deployments.openai.errors import APIError
from deployments.openai.output_events import (
    ChoiceDelta,
    ChoiceOutput,
    Deltas,
    Finished,
    OutputEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallArguments,
    ToolCallOpened,
    TypedEventFrames,
    sse_event,
)
from deployments.openai.reasoning import ReasoningParser
from deployments.openai.tool_calls import ToolCallOutput

_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


class ResponseBuilder:
    """One response's output items and stream events, from its choice's events in order."""

    def __init__(self, response_id: str, model: str, echo: dict[str, Any], prompt_tokens: int) -> None:
        self.head = {"id": response_id, "object": "response", "created_at": int(time.time()), "model": model}
        self.echo = echo
        self.prompt_tokens = prompt_tokens
        self.output: list[dict[str, Any]] = []
        self.open: list[int] = []
        """Output indices of the items still being written."""
        self.call_items: dict[int, int] = {}
        """A call's index among the choice's calls -> its output index."""
        self.sequence = 0
        self.output_tokens = 0

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def response(self, status: str, **fields: Any) -> dict[str, Any]:
        return {**self.head, "status": status, "output": self.output, **self.echo, "error": None, "incomplete_details": None, "usage": None, **fields}

    def start(self) -> list[dict[str, Any]]:
        snapshot = self.response("in_progress") | {"output": []}
        return [self.event("response.created", response=snapshot), self.event("response.in_progress", response=snapshot)]

    def feed(self, event: OutputEvent) -> list[dict[str, Any]]:
        if isinstance(event, ReasoningDelta):
            events = self._open_reasoning()
            index = self.open[-1]
            self.output[index]["content"][0]["text"] += event.text
            return events + [
                self.event("response.reasoning_text.delta", item_id=self.output[index]["id"], output_index=index, content_index=0, delta=event.text)
            ]
        if isinstance(event, TextDelta):
            events = self._open_message()
            index = self.open[-1]
            self.output[index]["content"][0]["text"] += event.text
            return events + [
                self.event("response.output_text.delta", item_id=self.output[index]["id"], output_index=index, content_index=0, delta=event.text, logprobs=[])
            ]
        if isinstance(event, ToolCallOpened):
            events = self._close_all("completed")
            item = {"id": new_item_id("fc"), "type": "function_call", "status": "in_progress", "call_id": event.call_id, "name": event.name, "arguments": ""}
            self.output.append(item)
            self.open.append(len(self.output) - 1)
            self.call_items[event.index] = len(self.output) - 1
            return events + [self.event("response.output_item.added", output_index=len(self.output) - 1, item=dict(item))]
        if isinstance(event, ToolCallArguments):
            index = self.call_items[event.index]
            self.output[index]["arguments"] += event.arguments
            return [self.event("response.function_call_arguments.delta", item_id=self.output[index]["id"], output_index=index, delta=event.arguments)]
        assert isinstance(event, Finished)
        return self._close_all("incomplete" if event.reason == "length" else "completed")

    def _open_message(self) -> list[dict[str, Any]]:
        if self.open and self.output[self.open[-1]]["type"] == "message":
            return []
        events = self._close_all("completed")
        item = {"id": new_item_id("msg"), "type": "message", "role": "assistant", "status": "in_progress", "content": []}
        self.output.append(item)
        index = len(self.output) - 1
        self.open.append(index)
        events.append(self.event("response.output_item.added", output_index=index, item=json.loads(_JSON.encode(item))))
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        item["content"].append(part)
        events.append(self.event("response.content_part.added", item_id=item["id"], output_index=index, content_index=0, part=dict(part)))
        return events

    def _open_reasoning(self) -> list[dict[str, Any]]:
        if self.open and self.output[self.open[-1]]["type"] == "reasoning":
            return []
        events = self._close_all("completed")
        item = {"id": new_item_id("rs"), "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": ""}], "status": "in_progress"}
        self.output.append(item)
        self.open.append(len(self.output) - 1)
        return events + [self.event("response.output_item.added", output_index=len(self.output) - 1, item=json.loads(_JSON.encode(item)) | {"content": []})]

    def _close_all(self, status: str) -> list[dict[str, Any]]:
        events = []
        for index in self.open:
            item = self.output[index]
            item["status"] = status
            if item["type"] == "reasoning":
                text = item["content"][0]["text"]
                events.append(self.event("response.reasoning_text.done", item_id=item["id"], output_index=index, content_index=0, text=text))
            elif item["type"] == "message":
                part = item["content"][0]
                events.append(self.event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0, text=part["text"], logprobs=[]))
                events.append(self.event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=dict(part)))
            else:
                events.append(self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index, arguments=item["arguments"]))
            events.append(self.event("response.output_item.done", output_index=index, item=json.loads(_JSON.encode(item))))
        self.open = []
        return events

    def usage(self) -> dict[str, Any]:
        return {
            "input_tokens": self.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.prompt_tokens + self.output_tokens,
        }

    def final(self, finish: Finished) -> dict[str, Any]:
        """The finished response: ``completed``, or ``incomplete`` when the token limit cut it."""
        if finish.reason == "length":
            return self.response("incomplete", incomplete_details={"reason": "max_output_tokens"}, usage=self.usage())
        return self.response("completed", usage=self.usage(), completed_at=int(time.time()))

    def failed(self, error: APIError) -> dict[str, Any]:
        code = "server_error" if error.status >= 500 or error.status == 499 else "invalid_prompt"
        return self.event("response.failed", response=self.response("failed", error={"code": code, "message": error.message}, usage=self.usage()))


def _delta_events(builder: ResponseBuilder, output: ChoiceOutput, delta: ChoiceDelta) -> tuple[list[dict[str, Any]], Finished | None]:
    """The stream events of one delta of the choice, and its finish when it finished."""
    events: list[dict[str, Any]] = []
    finished = None
    for event in output.events(delta):
        events += builder.feed(event)
        finished = event if isinstance(event, Finished) else finished
    builder.output_tokens = output.output_tokens
    return events, finished


class ResponseFrames(TypedEventFrames):
    """A streamed response's frames, one step at a time; a failure midway ends it with ``response.failed``."""

    where = "a response stream"

    def delta_events(self, delta: ChoiceDelta) -> list[dict[str, Any]]:
        events, finished = _delta_events(self.builder, self.output, delta)
        if finished is not None:
            done = self.builder.final(finished)
            events.append(self.builder.event("response.incomplete" if done["status"] == "incomplete" else "response.completed", response=done))
        return events

    def error_frame(self, error: APIError) -> str:
        return sse_event(self.builder.failed(error))


async def response_body(
    builder: ResponseBuilder, tool_calls: ToolCallOutput | None, deltas: Deltas, reasoning: ReasoningParser | None = None
) -> dict[str, Any]:
    output = ChoiceOutput(tool_calls, reasoning)
    finished: Finished | None = None
    async with aclosing(deltas):
        async for step in deltas:
            for delta in step.values():
                finished = _delta_events(builder, output, delta)[1] or finished
    assert finished is not None
    return builder.final(finished)
