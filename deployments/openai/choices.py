"""Completions and Chat Completions written from the engine's deltas: the choice builder.

`completion_frames` streams SSE chunks, `completion_body` answers the whole body; both read the
deltas `deployments.engine_client.EngineClient.deltas` gives (which owns the request's life: its
metrics, its release and abort), and every choice is built here (`choice_json`, `full_choice`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing

from deployments.openai.errors import APIError, internal_error
from deployments.openai.logprobs import LogprobEntry, PromptLogprobEntries
from deployments.openai.output_events import ChoiceDelta
from deployments.openai.protocol import StreamUsage
from deployments.openai.reasoning import ReasoningSplitter
from deployments.openai.responses import DONE_FRAME, ResponseFormat, sse
from deployments.openai.tool_calls import ChoiceToolCalls

Usage = Callable[[int], dict[str, object]]
"""The request's usage for so many completion tokens."""


async def completion_frames(
    fmt: ResponseFormat, echo_texts: list[str], deltas: AsyncGenerator[dict[int, ChoiceDelta], None], usage_of: Usage, usage: StreamUsage
) -> AsyncGenerator[str, None]:
    """SSE frames until every choice finished, then ``[DONE]``; an error frame if the request fails midway.
    ``echo_texts``: the prompt text each choice echoes (one per choice)."""
    completion_tokens = 0
    tail = ""  # the last chunk, usage and [DONE] go out in one write

    def usage_so_far() -> dict[str, object] | None:
        return usage_of(completion_tokens) if usage.continuous else None

    try:
        async with aclosing(deltas):
            offsets = [len(text) for text in echo_texts]
            calls = [ChoiceToolCalls(fmt.tool_calls) for _ in echo_texts] if fmt.tool_calls else None
            thoughts = [ReasoningSplitter(fmt.reasoning) for _ in echo_texts] if fmt.reasoning is not None else None
            # An echo with logprobs goes out with its logprobs, which come with the choice's first delta.
            opening = [""] * len(offsets) if fmt.echo_logprobs is not None else echo_texts
            if fmt.chat or any(opening):
                roles = [fmt.chunk_choice(i, opening[i], None, None, role=True) for i in range(len(echo_texts))]
                yield fmt.chunk_frame(roles, usage_so_far())
            unfinished = len(echo_texts)
            async for step in deltas:
                choices = []
                for i, d in step.items() if len(step) == 1 else sorted(step.items()):
                    completion_tokens += len(d.token_ids)
                    unfinished -= d.finish_reason is not None
                    choices.append(choice_json(fmt, i, d, offsets[i], calls[i] if calls else None, echo_texts[i], thoughts[i] if thoughts else None))
                    offsets[i] += len(d.text)
                if unfinished:
                    yield fmt.encoded_chunk_frame(choices, usage_so_far())
                else:
                    tail = fmt.encoded_chunk_frame(choices, usage_so_far())
        if usage.final:
            tail += sse(fmt.usage_chunk(usage_of(completion_tokens)))
    except APIError as error:
        tail = error.sse_frame()
    except Exception as error:  # a fault of this request alone: its stream ends with an error frame, not cut
        tail = internal_error(error, "a response stream").sse_frame()
    yield tail + DONE_FRAME


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
