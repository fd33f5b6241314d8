"""`PromptEncoder`: client text to token ids on a few worker threads, never on the ingress event loop.

Tokenizing a long prompt or rendering a chat template costs milliseconds; on the event loop
every other stream of the replica would wait. Each request's prompts, and its other strings
(bad words, DRY breakers, negative prompt), are encoded once, on a small bounded pool, so a
burst of large requests queues there instead. A structured-output constraint is checked
there too (compiled without the tokenizer), so a bad one is refused before the engine sees it.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from engine.grammar.limits import GrammarLimits
from engine.grammar.spec import grammar_error
from engine.tokenizer import TextTokenizer
from sampling.params import SamplingParams
from sampling.structured_outputs import StructuredOutputs
from sampling.tokenized import TokenizedStrings, has_strings, tokenize_strings

ENCODE_WORKERS = 2


class PromptEncoder:
    def __init__(self, tokenizer: TextTokenizer, workers: int = ENCODE_WORKERS) -> None:
        self.tokenizer = tokenizer
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="spout-encode")

    async def prompts(self, prompts: list[str | list[int]]) -> list[list[int]]:
        """Text prompts encoded (special tokens written in them recognised); token-id prompts as given."""
        if all(isinstance(p, list) for p in prompts):
            return prompts  # type: ignore[return-value]
        return await asyncio.get_running_loop().run_in_executor(self.pool, self._encode_all, prompts)

    async def chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool, tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The chat template's prompt for ``messages`` and ``tools``; raises `engine.tokenizer.ChatTemplateError`."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, self.tokenizer.encode_chat, messages, add_generation_prompt, tools)

    async def strings(self, params: SamplingParams) -> TokenizedStrings | None:
        """The request's strings as ids (`tokenize_strings`); None when it has none."""
        if not has_strings(params):
            return None
        return await asyncio.get_running_loop().run_in_executor(self.pool, tokenize_strings, params, self.tokenizer.encode)

    async def grammar_error(self, constraint: StructuredOutputs, limits: GrammarLimits) -> str | None:
        """Why ``constraint`` does not compile under ``limits`` (`engine.grammar.spec.grammar_error`); None when it does."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, grammar_error, constraint, limits)

    def _encode_all(self, prompts: list[str | list[int]]) -> list[list[int]]:
        return [self.tokenizer.encode(p) if isinstance(p, str) else p for p in prompts]
