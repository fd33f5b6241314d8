"""The one event model every API's writer renders: a choice's output as it comes from the engine
(`ChoiceDelta`: text, ids, finish, logprobs, coalesced across engine steps), and read as events
(`OutputEvent`): text deltas, tool calls opening and their argument deltas, and the finish.

The ingress streams, detokenizes, limits and aborts one way for every API
(`deployments.engine_client.EngineClient.deltas`); Chat Completions and Completions render the
deltas as choices (`deployments.openai.choices`), the Responses API
(`deployments.openai.responses_api`) and Anthropic's Messages API (`deployments.anthropic`) render
the events of `ChoiceOutput`, which reads tool calls with the same parsers as chat.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field

from deployments.openai.errors import APIError, internal_error
from deployments.openai.logprobs import LogprobEntry, PromptLogprobEntries
from deployments.openai.reasoning import ReasoningParser, ReasoningSplitter
from deployments.openai.tool_calls import ChoiceToolCalls, ToolCallOutput


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


async def api_frames(
    opening: str, steps: AsyncGenerator[tuple[str, bool], None], deltas: AsyncGenerator[object, None], error_frame: Callable[[APIError], str], where: str
) -> AsyncGenerator[str, None]:
    """An API writer's stream: ``opening``, then the frames of each of ``steps`` (``(frames, finished)``,
    read from ``deltas``), the last one sent with nothing after it; a request that fails midway ends
    with ``error_frame`` of its error instead (a fault nobody foresaw as a 500). ``deltas`` is closed
    however it ends, which releases the request (`deployments.engine_client.EngineClient.deltas`)."""
    tail = ""
    try:
        yield opening
        async with aclosing(deltas):
            async for frames, finished in steps:
                if finished:
                    tail = frames
                else:
                    yield frames
    except APIError as error:
        tail = error_frame(error)
    except Exception as error:  # a fault of this request alone: its stream ends with an error, not cut
        tail = error_frame(internal_error(error, where))
    yield tail
