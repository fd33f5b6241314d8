"""vLLM's ``/tokenize`` and ``/detokenize`` and its chat-prompt and structured-output options,
against the real app (issue 28, items 4 and 5)."""

from __future__ import annotations

import json
import re

import httpx

MESSAGES = [{"role": "user", "content": "Name three fruits."}]
PREFILL = [*MESSAGES, {"role": "assistant", "content": "Sure: apples,"}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}


def post(http: httpx.Client, path: str, **body) -> dict:
    response = http.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_tokenize_counts_what_completions_and_chat_count(server):
    with server.http() as http:
        prompt = post(http, "/tokenize", model=server.model, prompt="The capital of France is", return_token_strs=True)
        completion = post(http, "/v1/completions", model=server.model, prompt="The capital of France is", max_tokens=1)
        chat_ids = post(http, "/tokenize", messages=MESSAGES)
        chat = post(http, "/v1/chat/completions", model=server.model, messages=MESSAGES, max_tokens=1)
    assert prompt["count"] == len(prompt["tokens"]) == completion["usage"]["prompt_tokens"] == 5
    assert prompt["max_model_len"] == 1024 and "".join(prompt["token_strs"]).replace("Ġ", " ") == "The capital of France is"
    assert chat_ids["count"] == chat["usage"]["prompt_tokens"] and chat_ids["token_strs"] is None


def test_detokenize_writes_the_ids_text_back(server):
    with server.http() as http:
        chat_ids = post(http, "/tokenize", messages=MESSAGES)["tokens"]
        text = post(http, "/detokenize", model=server.model, tokens=chat_ids)["prompt"]
        assert text.startswith("<|im_start|>") and text.endswith("Name three fruits.<|im_end|>\n<|im_start|>assistant\n")
        assert post(http, "/tokenize", prompt=text, add_special_tokens=False)["tokens"] == chat_ids
        for body in ({"tokens": [10**6]}, {"tokens": [1] * 1025}, {"tokens": []}, {"model": "other", "tokens": [1]}):
            response = http.post("/detokenize", json=body)
            assert response.status_code in (400, 404) and response.json()["error"]["param"] in ("tokens", "model"), response.text


def test_tokenize_is_behind_the_key_and_in_the_openapi_document(server):
    for path in ("/tokenize", "/detokenize"):
        assert httpx.post(f"{server.base_url}{path}", json={"prompt": "x"}, timeout=60).status_code == 401
    with server.http() as http:
        assert {"/tokenize", "/detokenize"} <= set(http.get("/openapi.json").json()["paths"])


def test_continue_final_message_continues_the_last_message(server):
    """The chat's prompt ends inside the assistant's message: its greedy output is the completion of those ids."""
    with server.http() as http:
        ids = post(http, "/tokenize", messages=PREFILL, add_generation_prompt=False, continue_final_message=True)["tokens"]
        assert post(http, "/detokenize", tokens=ids)["prompt"].endswith("<|im_start|>assistant\nSure: apples,")
        body = {"model": server.model, "max_tokens": 8, "temperature": 0.0}
        chat = post(http, "/v1/chat/completions", messages=PREFILL, add_generation_prompt=False, continue_final_message=True, **body)
        completion = post(http, "/v1/completions", prompt=ids, **body)
        refused = http.post("/v1/chat/completions", json={"messages": PREFILL, "continue_final_message": True, **body})
    assert chat["usage"]["prompt_tokens"] == len(ids)
    assert chat["choices"][0]["message"]["content"] == completion["choices"][0]["text"]
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "continue_final_message"


def test_chat_template_kwargs_are_taken_and_checked(server):
    with server.http() as http:
        post(http, "/v1/chat/completions", model=server.model, messages=MESSAGES, max_tokens=1, chat_template_kwargs={"enable_thinking": False})
        clash = http.post("/v1/chat/completions", json={"model": server.model, "messages": MESSAGES, "chat_template_kwargs": {"messages": []}})
    assert clash.status_code == 400 and "chat_template_kwargs" in clash.json()["error"]["message"]


def test_structured_output_options(server):
    """vLLM's whitespace options and its structural tag, through chat."""
    body = {"model": server.model, "messages": [{"role": "user", "content": "Paris as JSON"}], "max_tokens": 40, "temperature": 0.0}
    tag = {
        "type": "structural_tag",
        "structures": [{"begin": "<city>", "schema": SCHEMA, "end": "</city>"}],
        "triggers": ["<city>"],
    }
    with server.http() as http:
        spaced = post(
            http, "/v1/chat/completions", **body, structured_outputs={"json": SCHEMA, "whitespace_pattern": "[ ]", "disable_additional_properties": True}
        )
        free = post(http, "/v1/chat/completions", **body, structured_outputs={"structural_tag": json.dumps(tag)})
        bad = http.post("/v1/chat/completions", json=body | {"structured_outputs": {"regex": "a", "disable_any_whitespace": True}})
    text = spaced["choices"][0]["message"]["content"]
    assert spaced["choices"][0]["finish_reason"] == "length" or set(json.loads(text)) == {"city"}, text
    for found in re.findall(r"<city>(.*?)</city>", free["choices"][0]["message"]["content"], re.S):
        assert "city" in json.loads(found)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "structured_outputs"
