"""OpenAI response bodies and SSE chunks for completions and chat completions."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import cached_property
from json.encoder import encode_basestring
from typing import Any

from deployments.openai.logprobs import LogprobEntry, PromptLogprobEntries, chat_logprobs, completion_logprobs, echo_entries, vllm_prompt_logprobs
from deployments.openai.reasoning import ReasoningParser
from deployments.openai.tool_calls import ToolCallOutput
from deployments.openai.tools import ToolCall, ToolCallDelta

DONE_FRAME = "data: [DONE]\n\n"
FRAME_END = "]}\n\n"
"""How every chunk frame ends: its ``choices`` list, its object, the SSE blank line."""
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)  # a frame is JSON or not written (NaN, infinities raise)


def sse(payload: dict[str, object]) -> str:
    return f"data: {_JSON.encode(payload)}\n\n"


@dataclass(frozen=True)
class ResponseFormat:
    """How one request's choices are written: ``chat`` or plain completions; with ``tool_calls``,
    how a chat's text is read for tool calls; with ``prompt_logprobs``, vLLM's field of that name
    (on each completion choice, once on a chat response) with that many alternatives; with
    ``echo_logprobs``, an echo's ``logprobs`` start with the prompt's tokens, with that many; with
    ``reasoning``, a chat's reasoning goes in ``reasoning_content`` and ``reasoning`` (clients read either)."""

    request_id: str
    model: str
    chat: bool
    created: int
    tool_calls: ToolCallOutput | None = None
    prompt_logprobs: int | None = None
    echo_logprobs: int | None = None
    reasoning: ReasoningParser | None = None

    @classmethod
    def new(
        cls,
        request_id: str,
        model: str,
        chat: bool,
        tool_calls: ToolCallOutput | None = None,
        prompt_logprobs: int | None = None,
        echo_logprobs: int | None = None,
        reasoning: ReasoningParser | None = None,
    ) -> ResponseFormat:
        return cls(request_id, model, chat, int(time.time()), tool_calls, prompt_logprobs, echo_logprobs, reasoning)

    def _envelope(self, obj: str, choices: list[dict[str, object]]) -> dict[str, object]:
        return {"id": self.request_id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def chunk(self, choices: list[dict[str, object]]) -> dict[str, object]:
        return self._envelope("chat.completion.chunk" if self.chat else "text_completion", choices)

    @cached_property
    def frame_start(self) -> str:
        """``data: {"id":...,"choices":[``: how each of this response's chunk frames starts."""
        return sse(self.chunk([]))[: -len(FRAME_END)]

    def chunk_frame(self, choices: list[dict[str, object]], usage: dict[str, object] | None = None) -> str:
        """``sse(self.chunk(choices))`` (with ``usage`` when given), the envelope encoded once per response, not per frame."""
        return self.encoded_chunk_frame([_JSON.encode(choice) for choice in choices], usage)

    def encoded_chunk_frame(self, choices: list[str], usage: dict[str, object] | None = None) -> str:
        """`chunk_frame` of choices already encoded (`choice_json`)."""
        frame = self.frame_start + ",".join(choices)
        return frame + FRAME_END if usage is None else f'{frame}],"usage":{_JSON.encode(usage)}}}\n\n'

    @cached_property
    def _text_choice_head(self) -> tuple[str, str]:
        """What a plain choice's JSON has before its index, and between its index and its text."""
        return ('{"index":', ',"delta":{"content":') if self.chat else ('{"index":', ',"text":')

    def choice_json(self, index: int, text: str, finish_reason: str | None, stop_reason: int | str | None, **extra: Any) -> str:
        """``chunk_choice(index, text, finish_reason, stop_reason, **extra)`` as JSON; a choice of text alone (a
        stream's common frame: no ``logprobs``, no ``tool_calls``) is written from a template, only its text encoded."""
        if extra.get("logprobs") is not None or extra.get("tool_calls") or extra.get("role") or extra.get("reasoning"):
            return _JSON.encode(self.chunk_choice(index, text, finish_reason, stop_reason, **extra))
        return self.text_choice_json(index, text, finish_reason, stop_reason)

    def text_choice_json(self, index: int, text: str, finish_reason: str | None, stop_reason: int | str | None) -> str:
        """`choice_json` of a choice of text alone, from the template."""
        head, middle = self._text_choice_head
        close = "}," if self.chat else ","
        finish = "null" if finish_reason is None else _JSON.encode(finish_reason)
        stop = "null" if stop_reason is None else _JSON.encode(stop_reason)
        return f'{head}{index}{middle}{encode_basestring(text)}{close}"logprobs":null,"finish_reason":{finish},"stop_reason":{stop}}}'

    def chunk_choice(
        self,
        index: int,
        text: str,
        finish_reason: str | None,
        stop_reason: int | str | None,
        logprobs: dict[str, object] | None = None,
        role: bool = False,
        tool_calls: list[ToolCallDelta] | None = None,
        reasoning: str = "",
    ) -> dict[str, object]:
        choice: dict[str, object] = {"index": index}
        if self.chat:
            delta: dict[str, object] = {"role": "assistant", "content": text} if role else {"content": text}
            if reasoning:
                delta |= {"reasoning_content": reasoning, "reasoning": reasoning}
            if tool_calls:
                delta["tool_calls"] = [call.wire() for call in tool_calls]
            choice["delta"] = delta
        else:
            choice["text"] = text
        return choice | {"logprobs": logprobs, "finish_reason": finish_reason, "stop_reason": stop_reason}

    def logprobs(self, entries: list[LogprobEntry] | None, text_offset: int) -> dict[str, object] | None:
        """The choice's ``logprobs`` field for these tokens; ``text_offset`` is where they start in its text."""
        if entries is None:
            return None
        return chat_logprobs(entries) if self.chat else completion_logprobs(entries, text_offset)

    def echo_logprobs_field(self, generated: list[LogprobEntry] | None, prompt: PromptLogprobEntries) -> dict[str, object]:
        """An echo's ``logprobs``: the prompt's tokens (the first with none), then the generated ones."""
        assert self.echo_logprobs is not None
        return completion_logprobs(echo_entries(prompt, self.echo_logprobs) + (generated or []), 0)

    def add_prompt_logprobs(self, body: dict[str, object], prompts: list[PromptLogprobEntries | None]) -> dict[str, object]:
        """``body`` (a whole response) with vLLM's ``prompt_logprobs``, when asked: per choice, in order."""
        if self.prompt_logprobs is None:
            return body
        fields = [None if p is None else vllm_prompt_logprobs(p, self.prompt_logprobs) for p in prompts]
        if self.chat:
            return body | {"prompt_logprobs": fields[0]}
        choices: list[dict[str, object]] = body["choices"]  # type: ignore[assignment]
        return body | {"choices": [choice | {"prompt_logprobs": field} for choice, field in zip(choices, fields)]}

    def usage_chunk(self, usage: dict[str, object]) -> dict[str, object]:
        return self.chunk([]) | {"usage": usage}

    def full(self, choices: list[dict[str, object]], usage: dict[str, object]) -> dict[str, object]:
        return self._envelope("chat.completion" if self.chat else "text_completion", choices) | {"usage": usage}

    def full_choice(
        self,
        index: int,
        text: str,
        finish_reason: str | None,
        stop_reason: int | str | None,
        logprobs: dict[str, object] | None,
        tool_calls: list[ToolCall] | None = None,
        reasoning: str = "",
    ) -> dict[str, object]:
        choice: dict[str, object] = {"index": index}
        if self.chat and tool_calls:
            calls = [call.model_dump() for call in tool_calls]
            choice["message"] = {"role": "assistant", "content": text or None, "tool_calls": calls}
        elif self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        if self.chat and self.reasoning is not None:
            choice["message"] |= {"reasoning_content": reasoning or None, "reasoning": reasoning or None}  # type: ignore[operator]
        if not self.chat:
            choice["text"] = text
        return choice | {"logprobs": logprobs, "finish_reason": finish_reason, "stop_reason": stop_reason}


def usage(prompt_tokens: int, completion_tokens: int, drafted: int = 0, accepted: int = 0) -> dict[str, object]:
    """OpenAI usage; drafted tokens, when any, as ``completion_tokens_details`` (accepted and rejected predictions)."""
    counts: dict[str, object] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}
    if drafted == 0:
        return counts
    return counts | {"completion_tokens_details": {"accepted_prediction_tokens": accepted, "rejected_prediction_tokens": drafted - accepted}}
