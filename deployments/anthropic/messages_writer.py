"""The Messages API's answers, written from the one event model (`deployments.openai.output_events`).

`MessageBuilder` turns a choice's events into content blocks and Anthropic's stream:
``message_start``; per block ``content_block_start``, ``content_block_delta`` (``thinking_delta``
with a reasoning parser, ``text_delta`` or ``input_json_delta``)..., ``content_block_stop``; then ``message_delta`` (the stop reason and the
output tokens) and ``message_stop``; an ``error`` event when the request fails midway. Stop reasons:
``end_turn``, ``max_tokens``, ``stop_sequence`` (with the sequence), ``tool_use``. A streamed and a
whole message are built by the same builder, so they agree.
"""

from __future__ import annotations

from contextlib import aclosing
from typing import Any

from deployments.anthropic.errors import error_frame
from deployments.openai.errors import APIError
from deployments.openai.model_json import read_json
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
)
from deployments.openai.reasoning import ReasoningParser
from deployments.openai.tool_calls import ToolCallOutput


def stop_reason(finish: Finished) -> tuple[str, str | None]:
    """Anthropic's stop reason and stop sequence for how the choice ended."""
    if finish.reason == "length":
        return "max_tokens", None
    if finish.reason == "tool_calls":
        return "tool_use", None
    if isinstance(finish.stop_reason, str):
        return "stop_sequence", finish.stop_reason
    return "end_turn", None


class MessageBuilder:
    """One message's content blocks and stream events, from its choice's events in order."""

    def __init__(self, message_id: str, model: str, prompt_tokens: int) -> None:
        self.message_id, self.model, self.prompt_tokens = message_id, model, prompt_tokens
        self.content: list[dict[str, Any]] = []
        self.arguments: dict[int, str] = {}
        """A tool_use block's index -> its input's JSON text so far."""
        self.open_block: int | None = None
        self.output_tokens = 0

    def message(self, stop: tuple[str | None, str | None] = (None, None)) -> dict[str, Any]:
        return {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": self.content,
            "stop_reason": stop[0],
            "stop_sequence": stop[1],
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": self.output_tokens},
        }

    def start(self) -> list[dict[str, Any]]:
        return [{"type": "message_start", "message": self.message() | {"content": []}}]

    def feed(self, event: OutputEvent) -> list[dict[str, Any]]:
        if isinstance(event, ReasoningDelta):
            events = [] if self._open_kind() == "thinking" else self._open({"type": "thinking", "thinking": "", "signature": ""})
            assert self.open_block is not None
            self.content[self.open_block]["thinking"] += event.text
            return events + [{"type": "content_block_delta", "index": self.open_block, "delta": {"type": "thinking_delta", "thinking": event.text}}]
        if isinstance(event, TextDelta):
            events = [] if self._open_kind() == "text" else self._open({"type": "text", "text": ""})
            assert self.open_block is not None
            self.content[self.open_block]["text"] += event.text
            return events + [{"type": "content_block_delta", "index": self.open_block, "delta": {"type": "text_delta", "text": event.text}}]
        if isinstance(event, ToolCallOpened):
            events = self._open({"type": "tool_use", "id": event.call_id, "name": event.name, "input": {}})
            assert self.open_block is not None
            self.arguments[self.open_block] = ""
            return events
        if isinstance(event, ToolCallArguments):
            index = self._call_block(event.index)
            self.arguments[index] += event.arguments
            return [{"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": event.arguments}}]
        assert isinstance(event, Finished)
        events = self._close()
        reason, sequence = stop_reason(event)
        delta = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": {"output_tokens": self.output_tokens}}
        return events + [delta, {"type": "message_stop"}]

    def _open_kind(self) -> str | None:
        return None if self.open_block is None else self.content[self.open_block]["type"]

    def _open(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close()
        self.content.append(block)
        self.open_block = len(self.content) - 1
        return events + [{"type": "content_block_start", "index": self.open_block, "content_block": dict(block)}]

    def _close(self) -> list[dict[str, Any]]:
        if self.open_block is None:
            return []
        index, self.open_block = self.open_block, None
        block = self.content[index]
        if block["type"] == "tool_use":
            read = read_json(self.arguments[index] or "{}")
            block["input"] = read.value if read is not None and isinstance(read.value, dict) else {}
        return [{"type": "content_block_stop", "index": index}]

    def _call_block(self, call_index: int) -> int:
        """The block of the choice's ``call_index``-th call."""
        return [i for i, block in enumerate(self.content) if block["type"] == "tool_use"][call_index]


class MessageFrames(TypedEventFrames):
    """A streamed message's frames, one step at a time; a failure midway ends it with an ``error`` event."""

    where = "a message stream"

    def delta_events(self, delta: ChoiceDelta) -> list[dict[str, Any]]:
        self.builder.output_tokens = self.output.output_tokens + len(delta.token_ids)
        events: list[dict[str, Any]] = []
        for event in self.output.events(delta):
            events += self.builder.feed(event)
        return events

    def error_frame(self, error: APIError) -> str:
        return error_frame(error)


async def message_body(builder: MessageBuilder, tool_calls: ToolCallOutput | None, deltas: Deltas, reasoning: ReasoningParser | None = None) -> dict[str, Any]:
    output = ChoiceOutput(tool_calls, reasoning)
    stop: tuple[str | None, str | None] = (None, None)
    async with aclosing(deltas):
        async for step in deltas:
            for delta in step.values():
                builder.output_tokens = output.output_tokens + len(delta.token_ids)
                for event in output.events(delta):
                    builder.feed(event)
                    if isinstance(event, Finished):
                        stop = stop_reason(event)
    return builder.message(stop)
