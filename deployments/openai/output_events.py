"""The one event model every API's writer renders: a choice's output as it comes from the engine
(`ChoiceDelta`: text, ids, finish, logprobs, coalesced across engine steps), and read as events
(`OutputEvent`): text deltas, tool calls opening and their argument deltas, and the finish.

The ingress streams, detokenizes, limits and aborts one way for every API
(`deployments.engine_client.EngineClient.deltas`); Chat Completions and Completions render the
deltas as choices (`deployments.openai.choices`), the Responses API
(`deployments.openai.responses_api`) and Anthropic's Messages API (`deployments.anthropic`) render
the events of `ChoiceOutput`, which reads tool calls with the same parsers as chat.

Every API's stream is a `StepFrames` (one step's deltas to its frames, nothing awaited:
`deployments.openai.choices.CompletionFrames`, and `TypedEventFrames` for the typed-event APIs), driven
from the request's deltas by `stream_frames`, or by the router's loop itself on a server that lets it
write (`deployments.engine_client.EngineClient.event_stream`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Protocol

from deployments.openai.errors import APIError, internal_error
from deployments.openai.event_stream import FinalFrame
from deployments.openai.logprobs import LogprobEntry, PromptLogprobEntries
from deployments.openai.reasoning import ReasoningParser, ReasoningSplitter
from deployments.openai.tool_calls import ChoiceToolCalls, ToolCallOutput

_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


@dataclass
class ChoiceDelta:
    """Text and token ids not yet sent for one choice, merged across engine steps."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[LogprobEntry] | None = None
    prompt_logprobs: PromptLogprobEntries | None = None
    """With the choice's first delta, when the request scores its prompt."""


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    """More of the choice's reasoning (with a reasoning parser: `deployments.openai.reasoning`)."""

    text: str


@dataclass(frozen=True)
class ToolCallOpened:
    """A call begins: its position among the choice's calls, its id and function name."""

    index: int
    call_id: str
    name: str


@dataclass(frozen=True)
class ToolCallArguments:
    """More of call ``index``'s arguments (they concatenate to a JSON object's text)."""

    index: int
    arguments: str


@dataclass(frozen=True)
class Finished:
    """The choice ended: ``reason`` as chat names it (``stop``, ``length``, ``tool_calls``, ...);
    ``stop_reason`` the stop string or stop token id that ended it (None: EOS, or no stop)."""

    reason: str
    stop_reason: int | str | None


OutputEvent = ReasoningDelta | TextDelta | ToolCallOpened | ToolCallArguments | Finished
Deltas = AsyncGenerator[dict[int, ChoiceDelta], None]
"""A request's deltas as `deployments.engine_client.EngineClient.deltas` gives them, per choice index."""


class ChoiceOutput:
    """One choice's deltas as events: with a reasoning parser, its reasoning split from its answer;
    the answer read for tool calls when the request offers tools."""

    def __init__(self, tool_calls: ToolCallOutput | None, reasoning: ReasoningParser | None = None) -> None:
        self.calls = ChoiceToolCalls(tool_calls) if tool_calls is not None else None
        self.splitter = ReasoningSplitter(reasoning) if reasoning is not None else None
        self.output_tokens = 0

    def events(self, delta: ChoiceDelta) -> list[OutputEvent]:
        self.output_tokens += len(delta.token_ids)
        finished = delta.finish_reason is not None
        thought, answer = ("", delta.text) if self.splitter is None else self.splitter.feed(delta.text, finished)
        text, pieces = (answer, []) if self.calls is None else self.calls.feed(answer, finished)
        events: list[OutputEvent] = [ReasoningDelta(thought)] if thought else []
        events += [TextDelta(text)] if text else []
        for piece in pieces:
            if piece.id is not None:
                events.append(ToolCallOpened(piece.index, piece.id, piece.function.name or ""))
            if piece.function.arguments:
                events.append(ToolCallArguments(piece.index, piece.function.arguments))
        if delta.finish_reason is not None:
            reason = delta.finish_reason if self.calls is None else self.calls.finish_reason(delta.finish_reason)
            events.append(Finished(reason or delta.finish_reason, delta.stop_reason))
        return events


class StepFrames(Protocol):
    """An API's stream made one engine step at a time, nothing awaited: `stream_frames` feeds it from a
    request's deltas, and the router's loop may feed it directly
    (`deployments.engine_client.EngineClient.event_stream`)."""

    where: str
    """What a fault nobody foresaw is reported in (``a response stream``)."""

    def opening(self) -> str | None:
        """The frames before any output, or None."""
        ...

    def step(self, step: dict[int, ChoiceDelta]) -> str:
        """The frames of one step's deltas; "" for the step that ends the stream (its frames go with `ending`)."""
        ...

    def ending(self, error: APIError | None) -> str:
        """The last write: the last step's frames, or ``error``'s frame when the request failed midway."""
        ...


def sse_event(event: dict[str, Any]) -> str:
    """A typed stream event as SSE, ``event:`` naming its type (the Responses and Messages APIs)."""
    return f"event: {event['type']}\ndata: {_JSON.encode(event)}\n\n"


class TypedEventFrames:
    """The `StepFrames` of an API whose stream is typed events (Responses, Messages): its builder's
    ``start()`` events, then each delta's (`delta_events`), the finishing delta's kept for the ending,
    which is the request's `error_frame` when it failed midway."""

    where: str

    def __init__(self, builder: Any, tool_calls: ToolCallOutput | None, reasoning: ReasoningParser | None = None) -> None:
        self.builder = builder
        self.output = ChoiceOutput(tool_calls, reasoning)
        self.tail = ""

    def delta_events(self, delta: ChoiceDelta) -> list[dict[str, Any]]:
        """The stream events of one delta of the choice (fed to the builder)."""
        raise NotImplementedError

    def error_frame(self, error: APIError) -> str:
        raise NotImplementedError

    def opening(self) -> str:
        return "".join(map(sse_event, self.builder.start()))

    def step(self, step: dict[int, ChoiceDelta]) -> str:
        frames = ""
        for delta in step.values():
            events = "".join(map(sse_event, self.delta_events(delta)))
            if delta.finish_reason is None:
                frames += events
            else:
                self.tail = events
        return frames

    def ending(self, error: APIError | None) -> str:
        return self.tail if error is None else self.error_frame(error)


async def stream_frames(frames: StepFrames, deltas: Deltas) -> AsyncGenerator[str, None]:
    """An API's stream: ``frames``' opening, each step's frames, then its ending as a `FinalFrame`
    (written with the body's end); a request that fails midway ends with its error's frame (a fault
    nobody foresaw as a 500). ``deltas`` is closed however it ends, which releases the request
    (`deployments.engine_client.EngineClient.deltas`)."""
    error: APIError | None = None
    try:
        async with aclosing(deltas):
            if (opening := frames.opening()) is not None:
                yield opening
            async for step in deltas:
                if frame := frames.step(step):
                    yield frame
    except APIError as failure:
        error = failure
    except Exception as failure:  # a fault of this request alone: its stream ends with an error frame, not cut
        error = internal_error(failure, frames.where)
    yield FinalFrame(frames.ending(error))
