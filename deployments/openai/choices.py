"""Completions and Chat Completions written from the engine's deltas: the choice builder.

`CompletionFrames` makes SSE chunks (`deployments.openai.output_events.stream_frames` streams them),
`completion_body` answers the whole body; both read the deltas
`deployments.engine_client.EngineClient.deltas` gives (which owns the request's life: its metrics,
its release and abort), and every choice is built here (`choice_json`, `full_choice`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing

from deployments.openai.errors import APIError
from deployments.openai.logprobs import LogprobEntry, PromptLogprobEntries
from deployments.openai.output_events import ChoiceDelta
from deployments.openai.protocol import StreamUsage
from deployments.openai.reasoning import ReasoningSplitter
from deployments.openai.responses import DONE_FRAME, ResponseFormat, sse
from deployments.openai.tool_calls import ChoiceToolCalls

Usage = Callable[[int], dict[str, object]]
"""The request's usage for so many completion tokens."""


class CompletionFrames:
    """A completion's or chat's SSE frames, made one step of deltas at a time: `opening`, a frame per
    `step`, then `ending` (the last chunk, usage and ``[DONE]`` in one write). ``echo_texts``: the
    prompt text each choice echoes (one per choice). A `StepFrames`: nothing here waits."""

    where = "a response stream"

    def __init__(self, fmt: ResponseFormat, echo_texts: list[str], usage_of: Usage, usage: StreamUsage) -> None:
        self.fmt = fmt
        self.echo_texts = echo_texts
        self.usage_of = usage_of
        self.usage = usage
        self.completion_tokens = 0
        self.unfinished = len(echo_texts)
        self.tail = ""
        """The frame of the step that finished the last choice, written with the ending."""
        self.offsets = [len(text) for text in echo_texts]
        self.calls = [ChoiceToolCalls(fmt.tool_calls) for _ in echo_texts] if fmt.tool_calls else None
        self.thoughts = [ReasoningSplitter(fmt.reasoning) for _ in echo_texts] if fmt.reasoning is not None else None

    def _usage_so_far(self) -> dict[str, object] | None:
        return self.usage_of(self.completion_tokens) if self.usage.continuous else None

    def opening(self) -> str | None:
        """A chat's first frame (each choice's role, and an echo's prompt), or None."""
        # An echo with logprobs goes out with its logprobs, which come with the choice's first delta.
        opening = [""] * len(self.offsets) if self.fmt.echo_logprobs is not None else self.echo_texts
        if not (self.fmt.chat or any(opening)):
            return None
        roles = [self.fmt.chunk_choice(i, opening[i], None, None, role=True) for i in range(len(self.echo_texts))]
        return self.fmt.chunk_frame(roles, self._usage_so_far())

    def step(self, step: dict[int, ChoiceDelta]) -> str:
        """The frame of one step's deltas; "" for the step that finishes the last choice (kept for `ending`)."""
        fmt, calls, thoughts = self.fmt, self.calls, self.thoughts
        choices = []
        for i, d in step.items() if len(step) == 1 else sorted(step.items()):
            self.completion_tokens += len(d.token_ids)
            self.unfinished -= d.finish_reason is not None
            choices.append(choice_json(fmt, i, d, self.offsets[i], calls[i] if calls else None, self.echo_texts[i], thoughts[i] if thoughts else None))
            self.offsets[i] += len(d.text)
        frame = fmt.encoded_chunk_frame(choices, self._usage_so_far())
        if self.unfinished:
            return frame
        self.tail = frame
        return ""

    def ending(self, error: APIError | None = None) -> str:
        """The last write: the last step's frame and the usage chunk, or ``error``'s frame; then ``[DONE]``."""
        if error is not None:
            return error.sse_frame() + DONE_FRAME
        usage = sse(self.fmt.usage_chunk(self.usage_of(self.completion_tokens))) if self.usage.final else ""
        return self.tail + usage + DONE_FRAME


async def completion_body(
    fmt: ResponseFormat, echo_texts: list[str], deltas: AsyncGenerator[dict[int, ChoiceDelta], None], usage_of: Usage
) -> dict[str, object]:
    """The whole response body once every choice finished."""
    texts = list(echo_texts)
    logprobs: list[list[LogprobEntry] | None] = [None] * len(texts)
    prompts: list[PromptLogprobEntries | None] = [None] * len(texts)
    finish: dict[int, tuple[str | None, int | str | None]] = {}
    completion_tokens = 0
    async with aclosing(deltas):
        async for step in deltas:
            for index, delta in step.items():
                texts[index] += delta.text
                if delta.logprobs is not None:
                    logprobs[index] = (logprobs[index] or []) + delta.logprobs
                if delta.prompt_logprobs is not None:
                    prompts[index] = delta.prompt_logprobs
                completion_tokens += len(delta.token_ids)
                if delta.finish_reason is not None:
                    finish[index] = (delta.finish_reason, delta.stop_reason)
    choices = [full_choice(fmt, i, texts[i], *finish[i], choice_logprobs(fmt, logprobs[i], prompts[i], len(echo_texts[i]))) for i in range(len(texts))]
    return fmt.add_prompt_logprobs(fmt.full(choices, usage_of(completion_tokens)), prompts)


def choice_json(
    fmt: ResponseFormat,
    index: int,
    delta: ChoiceDelta,
    offset: int,
    calls: ChoiceToolCalls | None,
    echo_text: str,
    thoughts: ReasoningSplitter | None = None,
) -> str:
    """A stream chunk's choice for ``delta``, encoded; with ``thoughts``, its reasoning split from its
    answer; with ``calls``, its answer read for tool calls. A first delta with the prompt's logprobs of
    an echo starts with ``echo_text``."""
    if calls is None and thoughts is None and delta.logprobs is None and delta.prompt_logprobs is None:  # a stream's common frame
        return fmt.text_choice_json(index, delta.text, delta.finish_reason, delta.stop_reason)
    logprobs = choice_logprobs(fmt, delta.logprobs, delta.prompt_logprobs, offset)
    if thoughts is not None:
        finished = delta.finish_reason is not None
        reasoning, answer = thoughts.feed(delta.text, finished)
        text, new_calls = (answer, []) if calls is None else calls.feed(answer, finished)
        reason = delta.finish_reason if calls is None else calls.finish_reason(delta.finish_reason)
        return fmt.choice_json(index, text, reason, delta.stop_reason, logprobs=logprobs, tool_calls=new_calls, reasoning=reasoning)
    if calls is None:
        echoed = echo_text if fmt.echo_logprobs is not None and delta.prompt_logprobs is not None else ""
        return fmt.choice_json(index, echoed + delta.text, delta.finish_reason, delta.stop_reason, logprobs=logprobs)
    text, new_calls = calls.feed(delta.text, finished=delta.finish_reason is not None)
    return fmt.choice_json(index, text, calls.finish_reason(delta.finish_reason), delta.stop_reason, logprobs=logprobs, tool_calls=new_calls)


def choice_logprobs(fmt: ResponseFormat, generated: list[LogprobEntry] | None, prompt: PromptLogprobEntries | None, offset: int) -> dict[str, object] | None:
    """A choice's ``logprobs``: an echo's prompt tokens first (when these are the ones that came with
    them), then the generated tokens, which start at ``offset`` in the choice's text."""
    if fmt.echo_logprobs is not None and prompt is not None:
        return fmt.echo_logprobs_field(generated, prompt)
    return fmt.logprobs(generated, offset)


def full_choice(
    fmt: ResponseFormat, index: int, text: str, finish_reason: str | None, stop_reason: int | str | None, logprobs: dict[str, object] | None
) -> dict[str, object]:
    """A whole response's choice; with the format's reasoning parser, its reasoning split from its
    answer; with its tool calls, the answer read for them."""
    reasoning, answer = ReasoningSplitter(fmt.reasoning).feed(text, finished=True) if fmt.reasoning is not None else ("", text)
    if fmt.tool_calls is None:
        return fmt.full_choice(index, answer, finish_reason, stop_reason, logprobs, reasoning=reasoning)
    calls = ChoiceToolCalls(fmt.tool_calls)
    content, _ = calls.feed(answer, finished=True)
    return fmt.full_choice(index, content, calls.finish_reason(finish_reason), stop_reason, logprobs, calls.calls, reasoning=reasoning)
