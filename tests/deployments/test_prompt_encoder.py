"""Prompts and chat templates are encoded on the encoder's worker threads, on the event loop only when
they are at most ``inline_max_bytes``; the workers' queue is bounded, and a request that would pass it
is the one refused."""

from __future__ import annotations

import asyncio
import threading

import pytest

from deployments.encode_backlog import JOB_BYTES
from deployments.openai.errors import APIError
from deployments.prompt_encoder import PromptEncoder
from engine.config import DEFAULT_MODEL
from engine.loader.model_files import load_tokenizer
from engine.prompt_length import PromptTooLong
from engine.tokenizer import ChatTemplateError, TextTokenizer

TOKENIZER = load_tokenizer(DEFAULT_MODEL)


class ThreadRecordingTokenizer(TextTokenizer):
    """The real tokenizer, noting the thread of every encode."""

    threads: list[str]

    def encode(self, text: str, add_special_tokens: bool = True, max_tokens: int | None = None) -> list[int]:
        self.threads.append(threading.current_thread().name)
        return super().encode(text, add_special_tokens, max_tokens)

    def encode_chat(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True, tools: list[dict] | None = None, max_tokens: int | None = None
    ) -> list[int]:
        self.threads.append(threading.current_thread().name)
        return super().encode_chat(messages, add_generation_prompt, tools, max_tokens)


def _recording() -> ThreadRecordingTokenizer:
    tokenizer = ThreadRecordingTokenizer(TOKENIZER.tokenizer, TOKENIZER.eos_token_ids, TOKENIZER.bos_token_id, TOKENIZER.chat_template)
    tokenizer.threads = []
    return tokenizer


def test_prompts_and_chat_encode_off_the_loop():
    tokenizer = _recording()
    encoder = PromptEncoder(tokenizer, inline_max_bytes=0)
    messages = [{"role": "user", "content": "Hi"}]

    async def run() -> tuple[list[list[int]], list[int]]:
        return await encoder.prompts(["Hello world", [5, 6], "Bye"]), await encoder.chat(messages, True, text_bytes=34)

    prompts, chat = asyncio.run(run())
    assert prompts == [TOKENIZER.encode("Hello world"), [5, 6], TOKENIZER.encode("Bye")]
    assert chat == TOKENIZER.encode_chat(messages, True)
    assert len(tokenizer.threads) == 3 and all(name.startswith("spout-encode") for name in tokenizer.threads)


def test_text_up_to_the_inline_limit_encodes_on_the_loop_and_longer_text_on_the_workers():
    tokenizer = _recording()
    encoder = PromptEncoder(tokenizer, inline_max_bytes=100)
    messages = [{"role": "user", "content": "Hi"}]

    async def run() -> list[str]:
        loop_thread = threading.current_thread().name
        await encoder.prompts(["a" * 60, "b" * 40])  # 100 bytes together: inline
        await encoder.prompts(["a" * 60, "b" * 41])  # 101: the workers
        await encoder.chat(messages, True, text_bytes=34)  # "Hi" and 32 for the message, as the limits count it: inline
        await encoder.chat(messages, True, text_bytes=101)
        await encoder.chat(messages, True)  # not counted: the workers
        return [name == loop_thread for name in tokenizer.threads]

    on_loop = asyncio.run(run())
    assert on_loop == [True, True, False, False, True, False, False]  # prompts encode one by one


def test_token_id_prompts_skip_the_pool():
    tokenizer = _recording()
    assert asyncio.run(PromptEncoder(tokenizer).prompts([[1, 2], [3]])) == [[1, 2], [3]]
    assert tokenizer.threads == []


def test_template_errors_reach_the_caller():
    tokenizer = TextTokenizer(TOKENIZER.tokenizer, TOKENIZER.eos_token_ids, TOKENIZER.bos_token_id, chat_template=None)
    with pytest.raises(ChatTemplateError):
        asyncio.run(PromptEncoder(tokenizer).chat([{"role": "user", "content": "x"}], True))


class BlockingTokenizer(TextTokenizer):
    """The real tokenizer, whose encodes wait until ``release`` is set."""

    release: threading.Event

    def encode(self, text: str, add_special_tokens: bool = True, max_tokens: int | None = None) -> list[int]:
        assert self.release.wait(timeout=60)
        return super().encode(text, add_special_tokens, max_tokens)


def _blocking() -> BlockingTokenizer:
    tokenizer = BlockingTokenizer(TOKENIZER.tokenizer, TOKENIZER.eos_token_ids, TOKENIZER.bos_token_id, TOKENIZER.chat_template)
    tokenizer.release = threading.Event()
    return tokenizer


def test_a_request_that_would_pass_the_backlog_gets_503_and_the_queued_one_runs():
    tokenizer = _blocking()
    encoder = PromptEncoder(tokenizer, max_backlog_bytes=JOB_BYTES + 100, workers=1, inline_max_bytes=0)

    async def run() -> tuple[list[list[int]], APIError, int]:
        queued = asyncio.create_task(encoder.prompts(["x" * 50]))
        await asyncio.sleep(0)
        with pytest.raises(APIError) as refused:
            await encoder.prompts(["y" * 60])
        tokenizer.release.set()
        return await queued, refused.value, encoder.backlog.held

    encoded, refusal, held_after = asyncio.run(run())
    assert encoded == [TOKENIZER.encode("x" * 50)] and held_after == 0
    assert (refusal.status, refusal.code) == (503, "encode_backlog_full") and "max_encode_backlog_bytes" in refusal.message
    assert refusal.response().body.startswith(b'{"error":')


def test_an_empty_backlog_takes_a_job_over_its_limit():
    encoder = PromptEncoder(TOKENIZER, max_backlog_bytes=1, inline_max_bytes=0)
    assert asyncio.run(encoder.prompts(["a long prompt"])) == [TOKENIZER.encode("a long prompt")]
    assert encoder.backlog.held == 0


def test_a_prompt_over_the_limit_reaches_the_caller():
    with pytest.raises(PromptTooLong):
        asyncio.run(PromptEncoder(TOKENIZER).prompts(["word " * 100], max_tokens=50))
    with pytest.raises(PromptTooLong):
        asyncio.run(PromptEncoder(TOKENIZER).chat([{"role": "user", "content": "word " * 100}], True, max_tokens=50))
