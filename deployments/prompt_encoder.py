"""`PromptEncoder`: client text to token ids on a few worker threads, or on the event loop when it is short.

Tokenizing a long prompt or rendering a chat template costs milliseconds; on the event loop
every other stream of the replica would wait. Each request's prompts, and its other strings
(bad words, DRY breakers, negative prompt), are encoded once, on a small pool, so a burst of
large requests queues there instead. A structured-output constraint is checked there too
(compiled without the tokenizer), so a bad one is refused before the engine sees it.

Short text is encoded on the event loop itself: the hop to a worker and back (a thread woken,
the loop woken through its self-pipe, the GIL handed over twice) costs about 100 µs of CPU
(measured: 90-150 µs a request against 16 µs to encode a 60-byte prompt inline), more than
encoding a few hundred bytes; up to ``inline_encode_max_bytes`` (chat: its text and 32 bytes a
message, as the limits count it), a job runs inline: at the default 256 bytes, 45 µs (letters, one
long word) to 220 µs (digits, one token each) with the default model's tokenizer, about 100 µs for
a chat of eight messages.

The pool's queue is bounded by the text it holds (`EncodeBacklog`): a request whose job would
pass ``max_encode_backlog_bytes`` gets 503 at once, and the jobs already queued run as before.
Prompts are encoded against the context (``max_tokens``), so one too long for it is refused
from a bounded prefix of the work (`engine.prompt_length.PromptTooLong` reaches the caller).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from deployments.encode_backlog import JOB_BYTES, EncodeBacklog
from deployments.limits import RequestLimits, utf8_size
from deployments.openai.errors import APIError
from engine.grammar.limits import GrammarLimits
from engine.grammar.spec import grammar_error
from engine.tokenizer import TextTokenizer
from sampling.params import SamplingParams
from sampling.structured_outputs import StructuredOutputs
from sampling.tokenized import TokenizedStrings, has_strings, tokenize_strings

ENCODE_WORKERS = 2
Result = TypeVar("Result")


class PromptEncoder:
    def __init__(
        self,
        tokenizer: TextTokenizer,
        max_backlog_bytes: int = RequestLimits().max_encode_backlog_bytes,
        workers: int = ENCODE_WORKERS,
        inline_max_bytes: int = RequestLimits().inline_encode_max_bytes,
    ) -> None:
        self.tokenizer = tokenizer
        self.inline_max_bytes = inline_max_bytes
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="spout-encode")
        self.backlog = EncodeBacklog(max_backlog_bytes)

    async def prompts(self, prompts: list[str | list[int]], max_tokens: int | None = None) -> list[list[int]]:
        """Text prompts encoded (special tokens written in them recognised); token-id prompts as given."""
        if all(isinstance(p, list) for p in prompts):
            return prompts  # type: ignore[return-value]
        text_bytes = sum(utf8_size(p) for p in prompts if isinstance(p, str))
        return await self._encode(text_bytes, self._encode_all, prompts, max_tokens)

    async def chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
        text_bytes: int | None = None,
        **options: Any,
    ) -> list[int]:
        """The chat template's prompt for ``messages`` and ``tools`` (``text_bytes``: what the client's text
        counted against the limits, `deployments.limits.check_messages`; None: not counted, so never
        inline; ``options``: `TextTokenizer.encode_chat`'s keyword options); raises `engine.tokenizer.ChatTemplateError`."""
        job = functools.partial(self.tokenizer.encode_chat, **options)
        if text_bytes is None:
            return await self._run(0, job, messages, add_generation_prompt, tools, max_tokens)
        return await self._encode(text_bytes, job, messages, add_generation_prompt, tools, max_tokens)

    async def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        """``text``'s ids (``/tokenize``), whatever their number."""
        return await self._encode(utf8_size(text), self.tokenizer.encode, text, add_special_tokens)

    async def decode(self, ids: list[int]) -> str:
        """The text of ``ids``, special tokens written out (``/detokenize``, as vLLM's)."""
        return await self._run(len(ids), self.tokenizer.decode, ids, False)

    async def strings(self, params: SamplingParams) -> TokenizedStrings | None:
        """The request's strings as ids (`tokenize_strings`); None when it has none."""
        if not has_strings(params):
            return None
        text_bytes = sum(map(utf8_size, [*params.bad_words, *params.dry_sequence_breakers, params.negative_prompt or ""]))
        return await self._encode(text_bytes, tokenize_strings, params, self.tokenizer.encode)

    async def grammar_error(self, constraint: StructuredOutputs, limits: GrammarLimits) -> str | None:
        """Why ``constraint`` does not compile under ``limits`` (`engine.grammar.spec.grammar_error`); None when it does."""
        return await self._run(constraint.text_size(), grammar_error, constraint, limits)

    async def _encode(self, text_bytes: int, job: Callable[..., Result], *args: Any) -> Result:
        """A tokenizing ``job(*args)``: at once on the event loop when its text is at most `inline_max_bytes`, else `_run`."""
        if text_bytes <= self.inline_max_bytes:
            return job(*args)
        return await self._run(text_bytes, job, *args)

    async def _run(self, text_bytes: int, job: Callable[..., Result], *args: Any) -> Result:
        """``job(*args)`` on a worker, charged ``text_bytes`` plus `JOB_BYTES` on the backlog until it ends; 503 when that would pass the limit."""
        charge = text_bytes + JOB_BYTES
        if not self.backlog.take(charge):
            raise APIError(
                503,
                f"this server replica's encode workers hold {self.backlog.held} bytes of text; this request's {charge} more would pass "
                f"its limit of {self.backlog.max_bytes} (max_encode_backlog_bytes): retry later",
                code="encode_backlog_full",
            )
        future = self.pool.submit(job, *args)
        future.add_done_callback(lambda _: self.backlog.give(charge))
        return await asyncio.wrap_future(future)

    def _encode_all(self, prompts: list[str | list[int]], max_tokens: int | None) -> list[list[int]]:
        return [self.tokenizer.encode(p, max_tokens=max_tokens) if isinstance(p, str) else p for p in prompts]
