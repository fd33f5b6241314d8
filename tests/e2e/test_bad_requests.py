"""Bad requests get the right status and OpenAI error JSON, and never disturb the server."""

from __future__ import annotations

import pytest

M = "smollm2-135m-instruct"
OK_MESSAGES = [{"role": "user", "content": "Hi"}]

# (name, method, path, body or raw bytes, headers override, expected status, expected param or None)
CASES = [
    ("malformed json", "POST", "/v1/completions", b'{"model": "x", "prompt": ', None, 400, None),
    ("json not an object", "POST", "/v1/completions", b"[1, 2]", None, 400, None),
    ("missing prompt", "POST", "/v1/completions", {"model": M}, None, 400, "prompt"),
    ("missing model", "POST", "/v1/completions", {"prompt": "x"}, None, 400, "model"),
    ("prompt wrong type", "POST", "/v1/completions", {"model": M, "prompt": 5}, None, 400, "prompt"),
    ("empty prompt list", "POST", "/v1/completions", {"model": M, "prompt": []}, None, 400, None),
    ("temperature negative", "POST", "/v1/completions", {"model": M, "prompt": "x", "temperature": -0.5}, None, 400, "temperature"),
    ("temperature a string", "POST", "/v1/completions", {"model": M, "prompt": "x", "temperature": "hot"}, None, 400, "temperature"),
    ("top_p zero", "POST", "/v1/completions", {"model": M, "prompt": "x", "top_p": 0}, None, 400, "top_p"),
    ("top_k below -1", "POST", "/v1/completions", {"model": M, "prompt": "x", "top_k": -2}, None, 400, "top_k"),
    ("min_p above 1", "POST", "/v1/completions", {"model": M, "prompt": "x", "min_p": 1.5}, None, 400, "min_p"),
    ("max_tokens zero", "POST", "/v1/completions", {"model": M, "prompt": "x", "max_tokens": 0}, None, 400, "max_tokens"),
    ("n zero", "POST", "/v1/completions", {"model": M, "prompt": "x", "n": 0}, None, 400, "n"),
    ("logprobs over 20", "POST", "/v1/completions", {"model": M, "prompt": "x", "logprobs": 21}, None, 400, "logprobs"),
    ("unknown field", "POST", "/v1/completions", {"model": M, "prompt": "x", "temprature": 1.0}, None, 400, "temprature"),
    ("priority under fcfs", "POST", "/v1/completions", {"model": M, "prompt": "x", "priority": 1}, None, 400, None),
    ("priority not an integer", "POST", "/v1/completions", {"model": M, "prompt": "x", "priority": "high"}, None, 400, "priority"),
    ("stop token out of vocab", "POST", "/v1/completions", {"model": M, "prompt": "x", "stop_token_ids": [10**6]}, None, 400, None),
    ("prompt token out of vocab", "POST", "/v1/completions", {"model": M, "prompt": [1, 999999]}, None, 400, None),
    ("prompt over the context", "POST", "/v1/completions", {"model": M, "prompt": [42] * 1024}, None, 400, "prompt"),
    ("body over the limit", "POST", "/v1/completions", {"model": M, "prompt": "x" * (1 << 20)}, None, 413, None),
    ("unknown model", "POST", "/v1/completions", {"model": "gpt-5", "prompt": "x"}, None, 404, "model"),
    ("missing key", "POST", "/v1/completions", {"model": M, "prompt": "x"}, {}, 401, None),
    ("wrong key", "POST", "/v1/completions", {"model": M, "prompt": "x"}, {"Authorization": "Bearer nope"}, 401, None),
    ("chat no messages", "POST", "/v1/chat/completions", {"model": M, "messages": []}, None, 400, "messages"),
    ("chat bad role", "POST", "/v1/chat/completions", {"model": M, "messages": [{"role": "wizard", "content": "x"}]}, None, 400, None),
    ("chat top_logprobs without logprobs", "POST", "/v1/chat/completions", {"model": M, "messages": OK_MESSAGES, "top_logprobs": 2}, None, 400, "top_logprobs"),
    (
        "chat max_completion_tokens negative",
        "POST",
        "/v1/chat/completions",
        {"model": M, "messages": OK_MESSAGES, "max_completion_tokens": -1},
        None,
        400,
        "max_tokens",
    ),
    ("stream not a bool", "POST", "/v1/chat/completions", {"model": M, "messages": OK_MESSAGES, "stream": "yes please"}, None, 400, "stream"),
    ("every allowed token banned", "POST", "/v1/completions", {"model": M, "prompt": "x", "allowed_token_ids": [2], "min_tokens": 3}, None, 400, None),
    ("prompt_logprobs over 20", "POST", "/v1/completions", {"model": M, "prompt": "x", "prompt_logprobs": 21}, None, 400, "prompt_logprobs"),
    (
        "prompt_logprobs streamed",
        "POST",
        "/v1/chat/completions",
        {"model": M, "messages": [{"role": "user", "content": "x"}], "prompt_logprobs": 1, "stream": True},
        None,
        400,
        "prompt_logprobs",
    ),
    (
        "max_tokens zero in chat",
        "POST",
        "/v1/chat/completions",
        {"model": M, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
        None,
        400,
        "max_tokens",
    ),
    ("unknown route", "POST", "/v1/embeddings", {"model": M, "input": "x"}, None, 404, None),
    ("wrong method", "GET", "/v1/completions", None, None, 405, None),
]


@pytest.mark.parametrize(("name", "method", "path", "body", "headers", "status", "param"), CASES, ids=[c[0] for c in CASES])
def test_bad_request(server, name, method, path, body, headers, status, param):
    with server.http() as http:
        if headers is not None:
            http.headers.pop("Authorization")
            http.headers.update(headers)
        if isinstance(body, bytes):
            response = http.request(method, path, content=body, headers={"Content-Type": "application/json"})
        else:
            response = http.request(method, path, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if param is not None:
        assert error["param"] == param


def test_server_still_serves_after_bad_requests(server):
    with server.http() as http:
        for case in CASES[:5]:
            body = case[3]
            http.post(case[2], content=body) if isinstance(body, bytes) else http.post(case[2], json=body)
        ok = http.post("/v1/completions", json={"model": M, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
    assert ok.status_code == 200
    assert "Paris" in ok.json()["choices"][0]["text"]
