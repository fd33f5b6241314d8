"""vLLM's ``/tokenize`` and ``/detokenize`` bodies, and the chat-prompt options a chat and a
tokenize request share (``continue_final_message``, ``chat_template_kwargs``)."""

from __future__ import annotations

import asyncio
import json

import pytest

from deployments.openai.errors import APIError
from deployments.openai.protocol import ChatCompletionRequest
from deployments.openai.request_body import validate_body
from deployments.openai.tokenize import DetokenizeRequest, TokenizeRequest

MESSAGES = [{"role": "user", "content": "Hi"}]


def parse(body_model, **body):
    return asyncio.run(validate_body(json.dumps(body).encode(), 32, body_model))


def refused(body_model, **body) -> APIError:
    with pytest.raises(APIError) as error:
        parse(body_model, **body)
    assert error.value.status == 400
    return error.value


def test_a_prompt_or_messages():
    prompt = parse(TokenizeRequest, prompt="Hello")
    assert prompt.model is None and prompt.add_special_tokens is None and not prompt.return_token_strs
    chat = parse(TokenizeRequest, model="m", messages=MESSAGES, add_generation_prompt=False, return_token_strs=True)
    assert chat.messages[0].text() == "Hi" and chat.template_options() == {"continue_final_message": False, "template_kwargs": None}
    assert refused(TokenizeRequest).param == "prompt"
    assert refused(TokenizeRequest, prompt="x", messages=MESSAGES).param == "prompt"


@pytest.mark.parametrize("field", ["tools", "add_generation_prompt", "continue_final_message", "chat_template_kwargs"])
def test_chat_fields_go_with_messages_only(field):
    value = {"tools": [], "add_generation_prompt": False, "continue_final_message": False, "chat_template_kwargs": {}}[field]
    assert refused(TokenizeRequest, prompt="x", **{field: value}).param == field


def test_the_chat_template_writes_a_chats_special_tokens():
    assert refused(TokenizeRequest, messages=MESSAGES, add_special_tokens=True).param == "add_special_tokens"


def test_unknown_fields_and_bad_ids_are_refused():
    assert refused(TokenizeRequest, prompt="x", temperature=1).param == "temperature"
    assert parse(DetokenizeRequest, tokens=[1, 2]).tokens == [1, 2]
    for tokens in ([], [-1], [2**32]):
        assert refused(DetokenizeRequest, tokens=tokens).param == "tokens"


@pytest.mark.parametrize("model", [ChatCompletionRequest, TokenizeRequest])
def test_continue_final_message_wants_add_generation_prompt_false(model):
    body = {"model": "m", "messages": MESSAGES + [{"role": "assistant", "content": "Hel"}], "continue_final_message": True}
    assert refused(model, **body).param == "continue_final_message"
    assert parse(model, **body, add_generation_prompt=False).template_options()["continue_final_message"]


def test_template_kwargs_count_as_client_text():
    body = parse(ChatCompletionRequest, model="m", messages=MESSAGES, chat_template_kwargs={"enable_thinking": False, "note": "é"})
    assert body.template_options()["template_kwargs"] == {"enable_thinking": False, "note": "é"}
    assert json.dumps({"enable_thinking": False, "note": "é"}, ensure_ascii=False) in body.client_texts()
    assert body.sampling_params().max_tokens is None  # not a sampling field
