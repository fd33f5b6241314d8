"""Chat's ``max_tokens`` when the request leaves it unset: the operator's ``default_max_tokens``
(4096), never below the request's ``min_tokens``; null keeps vLLM's "until the context is full".
Completions keep OpenAI's 16. Through the protocol and through the ingress's request path."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from deployments.config import ServeArgs
from deployments.openai.protocol import ChatCompletionRequest
from deployments.openai.reasoning import REASONING_PARSERS
from detok import AnswerRules
from tests.deployments.in_process import WAIT_S, FakeEngineClient, chat, completion, ingress

MESSAGES = [{"role": "user", "content": "hi"}]


def chat_max_tokens(default: int | None, **fields: object) -> int | None:
    return ChatCompletionRequest(model="m", messages=MESSAGES, **fields).sampling_params(default).max_tokens


@pytest.mark.parametrize(
    ("default", "fields", "expected"),
    [
        (4096, {}, 4096),
        (4096, {"max_tokens": 10}, 10),
        (4096, {"max_tokens": 9000}, 9000),  # the request's own, above the default: the context bounds it
        (4096, {"max_completion_tokens": 7, "max_tokens": 10}, 7),
        (4096, {"min_tokens": 5000}, 5000),
        (None, {}, None),
        (None, {"min_tokens": 5000}, None),  # until the context is full, at least 5000
        (None, {"max_tokens": 10}, 10),
    ],
)
def test_the_default_applies_only_where_the_request_sets_no_limit(default, fields, expected):
    assert chat_max_tokens(default, **fields) == expected


def test_the_option_is_4096_a_positive_count_or_null():
    assert ServeArgs().default_max_tokens == 4096
    assert ServeArgs(default_max_tokens=None).default_max_tokens is None
    with pytest.raises(ValidationError, match="default_max_tokens"):
        ServeArgs(default_max_tokens=0)


@pytest.mark.timeout(2 * WAIT_S)
@pytest.mark.parametrize(("option", "chat_expected"), [(100, 100), (None, None)])
def test_the_ingress_sends_the_engine_the_operators_default(option, chat_expected):
    async def run() -> list[int | None]:
        client = FakeEngineClient()
        client.finish.set()
        replica = ingress(client, default_max_tokens=option)
        answered = [await asyncio.wait_for(replica(request), WAIT_S) for request in (chat(n=1, max_tokens=None), completion(n=1, max_tokens=None))]
        assert [response.status_code for response in answered] == [200, 200]
        return [params.max_tokens for params in client.submitted]

    assert asyncio.run(run()) == [chat_expected, 16]


@pytest.mark.timeout(2 * WAIT_S)
@pytest.mark.parametrize(("thinking", "engine_expected"), [(100, 105), (None, None)])
def test_with_a_reasoning_parser_max_tokens_counts_the_answer(thinking, engine_expected):
    """The engine's limit is the answer's plus max_thinking_tokens (None: the context), and the
    detokenizer gets the answer's own (`detok.answer`); a completion has no thinking."""

    async def run() -> tuple[list[int | None], list[object]]:
        client = FakeEngineClient()
        client.finish.set()
        replica = ingress(client, reasoning_parser="qwen3", max_thinking_tokens=thinking)
        answered = [await asyncio.wait_for(replica(request), WAIT_S) for request in (chat(n=1, max_tokens=5), completion(n=1, max_tokens=5))]
        assert [response.status_code for response in answered] == [200, 200]
        return [params.max_tokens for params in client.submitted], client.answers

    limits, answers = asyncio.run(run())
    assert limits == [engine_expected, 5]
    assert answers == [AnswerRules(REASONING_PARSERS["qwen3"].tags, 5), None]
