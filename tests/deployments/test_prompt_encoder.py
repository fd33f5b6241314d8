"""Prompts and chat templates are encoded on the encoder's worker threads, never on the event loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from deployments.prompt_encoder import PromptEncoder
from engine.loader.checkpoint import DEFAULT_MODEL, load_tokenizer
from engine.tokenizer import ChatTemplateError, TextTokenizer

TOKENIZER = load_tokenizer(DEFAULT_MODEL)


class ThreadRecordingTokenizer(TextTokenizer):
    """The real tokenizer, noting the thread of every encode."""

    threads: list[str]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.threads.append(threading.current_thread().name)
        return super().encode(text, add_special_tokens)

    def encode_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True, tools: list[dict] | None = None) -> list[int]:
        self.threads.append(threading.current_thread().name)
        return super().encode_chat(messages, add_generation_prompt, tools)


def _recording() -> ThreadRecordingTokenizer:
    tokenizer = ThreadRecordingTokenizer(TOKENIZER.tokenizer, TOKENIZER.eos_token_ids, TOKENIZER.bos_token_id, TOKENIZER.chat_template)
    tokenizer.threads = []
    return tokenizer


def test_prompts_and_chat_encode_off_the_loop():
    tokenizer = _recording()
    encoder = PromptEncoder(tokenizer)
    messages = [{"role": "user", "content": "Hi"}]

    async def run() -> tuple[list[list[int]], list[int]]:
        return await encoder.prompts(["Hello world", [5, 6], "Bye"]), await encoder.chat(messages, True)

    prompts, chat = asyncio.run(run())
    assert prompts == [TOKENIZER.encode("Hello world"), [5, 6], TOKENIZER.encode("Bye")]
    assert chat == TOKENIZER.encode_chat(messages, True)
    assert len(tokenizer.threads) == 3 and all(name.startswith("spout-encode") for name in tokenizer.threads)


def test_token_id_prompts_skip_the_pool():
    tokenizer = _recording()
    assert asyncio.run(PromptEncoder(tokenizer).prompts([[1, 2], [3]])) == [[1, 2], [3]]
    assert tokenizer.threads == []


def test_template_errors_reach_the_caller():
    tokenizer = TextTokenizer(TOKENIZER.tokenizer, TOKENIZER.eos_token_ids, TOKENIZER.bos_token_id, chat_template=None)
    with pytest.raises(ChatTemplateError):
        asyncio.run(PromptEncoder(tokenizer).chat([{"role": "user", "content": "x"}], True))
