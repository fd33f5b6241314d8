"""The new routes through the ingress's own request path, in-process (`tests.deployments.in_process`):
``/tokenize``, ``/detokenize`` and ``/v1/messages/count_tokens`` answers; the key from ``x-api-key``;
errors on the Messages API's routes in Anthropic's shape, elsewhere in OpenAI's."""

from __future__ import annotations

import asyncio
import json

from pydantic import SecretStr

from deployments.auth import APIKeyCheck
from engine.loader.model_files import load_tokenizer
from tests.deployments.in_process import FakeEngineClient, ingress, post

MESSAGES = [{"role": "user", "content": "hello there"}]


TOKENIZER = load_tokenizer("tiny-random")


def answer(path: str, body: dict, headers: list[tuple[bytes, bytes]] = (), key: str | None = None) -> tuple[int, dict]:
    """The status and JSON body the ingress answers (with ``key`` as the server's API key)."""

    async def run():
        made = ingress(FakeEngineClient())
        if key is not None:
            made.auth = APIKeyCheck(SecretStr(key))
        response = await made(post(path, body, headers=headers))
        return response.status_code, json.loads(response.body)

    return asyncio.run(run())


def test_tokenize_and_detokenize_answer_in_vllms_shapes():
    status, prompt = answer("/tokenize", {"prompt": "hello there", "return_token_strs": True})
    tokenizer = TOKENIZER
    assert status == 200 and prompt["tokens"] == tokenizer.encode("hello there") and prompt["count"] == len(prompt["tokens"])
    assert prompt["max_model_len"] == 256 and len(prompt["token_strs"]) == prompt["count"]
    status, chat = answer("/tokenize", {"model": "tiny-random", "messages": MESSAGES})
    assert status == 200 and chat["tokens"] == tokenizer.encode_chat(MESSAGES) and chat["token_strs"] is None
    status, text = answer("/detokenize", {"tokens": prompt["tokens"]})
    assert status == 200 and text["prompt"] == tokenizer.decode(prompt["tokens"], skip_special_tokens=False)
    status, refused = answer("/tokenize", {"model": "other", "prompt": "x"})
    assert status == 404 and refused["error"]["param"] == "model"


def test_count_tokens_counts_the_prompt_a_message_request_sends():
    body = {"model": "tiny-random", "system": "Be brief.", "messages": MESSAGES}
    status, counted = answer("/v1/messages/count_tokens", body)
    expected = TOKENIZER.encode_chat([{"role": "system", "content": "Be brief."}, *MESSAGES])
    assert status == 200 and counted == {"input_tokens": len(expected)}


def test_messages_errors_take_anthropics_shape_and_the_key_comes_as_x_api_key():
    status, refused = answer("/v1/messages", {"model": "tiny-random", "messages": MESSAGES})  # no max_tokens
    assert status == 400 and refused["type"] == "error" and refused["error"]["type"] == "invalid_request_error" and "max_tokens" in refused["error"]["message"]
    status, refused = answer("/v1/messages/count_tokens", {"model": "tiny-random", "messages": MESSAGES}, key="s3cret")
    assert status == 401 and refused["error"]["type"] == "authentication_error"
    status, counted = answer("/v1/messages/count_tokens", {"model": "tiny-random", "messages": MESSAGES}, [(b"x-api-key", b"s3cret")], key="s3cret")
    assert status == 200 and counted["input_tokens"] > 0
    status, refused = answer("/v1/responses", {"model": "tiny-random", "input": "hi", "store": True})
    assert status == 400 and refused["error"]["param"] == "store" and set(refused["error"]) == {"message", "type", "param", "code"}


def test_routes_are_found_under_the_apps_route_prefix():
    """An app served at ``/think`` is asked for ``/think/tokenize``: ASGI's path holds the prefix, and
    Serve puts it in ``root_path`` too; a path that only starts with the prefix's letters is not under it."""

    async def statuses(*cases: tuple[str, str]) -> list[int]:
        made, answered = ingress(FakeEngineClient()), []
        for path, root_path in cases:
            request = post(path, {"prompt": "hello"})
            request.scope["root_path"] = root_path
            answered.append((await made(request)).status_code)
        return answered

    under = asyncio.run(statuses(("/think/tokenize", "/think"), ("/think/tokenize/", "/think/"), ("/tokenize", "")))
    assert under == [200, 200, 200]
    assert asyncio.run(statuses(("/thinker/tokenize", "/think"), ("/tokenize", "/think"))) == [404, 200]
