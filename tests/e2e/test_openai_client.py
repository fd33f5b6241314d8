"""The openai client against the real app: completions and chat, streaming and not; their raw bodies and
chunks validated strictly with the openai package's own types."""

from __future__ import annotations

import json

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from prometheus_client.parser import text_string_to_metric_families

from tests.sdk_types import VLLM_CHOICE_FIELDS, CompletionChunk, strict

PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "Name three fruits."}]


def stream_completion(client, **kwargs) -> tuple[dict[int, str], dict[int, str], list]:
    texts: dict[int, str] = {}
    finish: dict[int, str] = {}
    chunks = list(client.completions.create(stream=True, **kwargs))
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    return texts, finish, chunks


def stream_chat(client, **kwargs) -> tuple[dict[int, str], dict[int, str], list]:
    texts: dict[int, str] = {}
    finish: dict[int, str] = {}
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    return texts, finish, chunks


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 1.0, "seed": 1234}])
def test_completion_stream_equals_non_stream(server, sampling):
    client = server.openai()
    full = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=24, **sampling)
    texts, finish, _ = stream_completion(client, model=server.model, prompt=PROMPT, max_tokens=24, **sampling)
    assert texts[0] == full.choices[0].text
    assert finish[0] == full.choices[0].finish_reason
    if sampling["temperature"] == 0.0:
        assert "Paris" in full.choices[0].text
    assert full.usage.completion_tokens <= 24 and full.usage.prompt_tokens == 5


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 0.8, "seed": 7}])
def test_chat_stream_equals_non_stream(server, sampling):
    client = server.openai()
    full = client.chat.completions.create(model=server.model, messages=MESSAGES, max_tokens=32, **sampling)
    texts, finish, chunks = stream_chat(client, model=server.model, messages=MESSAGES, max_tokens=32, **sampling)
    assert texts[0] == full.choices[0].message.content
    assert finish[0] == full.choices[0].finish_reason
    assert chunks[0].choices[0].delta.role == "assistant"
    assert full.choices[0].message.role == "assistant"


def test_n2_choices_have_their_own_index_and_finish_reason(server):
    client = server.openai()
    full = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=8, n=2, temperature=1.0, seed=5)
    assert sorted(c.index for c in full.choices) == [0, 1]
    assert all(c.finish_reason in ("stop", "length") for c in full.choices)
    texts, finish, _ = stream_completion(client, model=server.model, prompt=PROMPT, max_tokens=8, n=2, temperature=1.0, seed=5)
    assert texts == {c.index: c.text for c in full.choices}
    assert set(finish) == {0, 1}
    chat = client.chat.completions.create(model=server.model, messages=MESSAGES, max_tokens=8, n=2, temperature=0.0)
    assert [c.index for c in chat.choices] == [0, 1]
    assert chat.choices[0].message.content == chat.choices[1].message.content  # greedy: both the same


def test_include_usage_adds_a_last_chunk_with_usage(server):
    client = server.openai()
    texts, _, chunks = stream_chat(client, model=server.model, messages=MESSAGES, max_tokens=6, temperature=0.0, stream_options={"include_usage": True})
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 6
    assert last.usage.total_tokens == last.usage.prompt_tokens + 6
    assert all(chunk.usage is None for chunk in chunks[:-1])


@pytest.mark.parametrize("chat", [False, True])
def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(server, chat):
    """vLLM's ``continuous_usage_stats``: each chunk's usage counts the tokens sent up to it; the last equals the final usage."""
    client = server.openai()
    options = {"include_usage": True, "continuous_usage_stats": True}
    request = {"model": server.model, "max_tokens": 12, "temperature": 1.0, "seed": 3, "n": 2, "stream_options": options, "extra_body": {"ignore_eos": True}}
    if chat:
        _, _, chunks = stream_chat(client, messages=MESSAGES, **request)
    else:
        _, _, chunks = stream_completion(client, prompt=PROMPT, **request)
    *streamed, final = chunks
    assert final.choices == [] and final.usage.completion_tokens == 24
    assert all(chunk.usage is not None and chunk.usage.prompt_tokens == final.usage.prompt_tokens for chunk in streamed)
    counts = [chunk.usage.completion_tokens for chunk in streamed]
    assert counts == sorted(counts) and counts[-1] == final.usage.completion_tokens
    assert all(chunk.usage.total_tokens == chunk.usage.prompt_tokens + chunk.usage.completion_tokens for chunk in streamed)
    without = stream_completion(client, prompt=PROMPT, **{**request, "stream_options": {"continuous_usage_stats": True}})[2]
    assert all(chunk.usage is None for chunk in without), "as vLLM: only with include_usage"


def test_echo_and_list_prompts(server):
    client = server.openai()
    echoed = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=4, temperature=0.0, echo=True)
    plain = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=4, temperature=0.0)
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text
    batch = client.completions.create(model=server.model, prompt=[PROMPT, "Hello"], max_tokens=4, temperature=0.0)
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.choices[0].text == plain.choices[0].text
    ids = client.completions.create(model=server.model, prompt=[504, 3575, 282, 4649, 314], max_tokens=4, temperature=0.0)
    assert ids.choices[0].text == plain.choices[0].text


def test_models_health_metrics(server):
    client = server.openai()
    assert [m.id for m in client.models.list().data] == [server.model]
    client.completions.create(model=server.model, prompt=PROMPT, max_tokens=2, temperature=0.0)
    with server.http() as http:
        assert http.get("/health").status_code == 200
        families = {family.name: family for family in text_string_to_metric_families(http.get("/metrics").text)}
    # vLLM's names with Spout's prefix (docs/metrics.md), each sample labelled with the served model
    aligned = ("num_requests_running", "num_requests_waiting", "time_to_first_token_seconds", "inter_token_latency_seconds", "prompt_tokens")
    aligned += ("generation_tokens", "request_success", "num_preemptions", "prefix_cache_queries", "prefix_cache_hits")
    assert {f"spout:{name}" for name in aligned} <= families.keys()
    assert sum(s.value for s in families["spout:request_success"].samples if s.name.endswith("_total")) >= 1  # the request above
    for family in families.values():
        for sample in family.samples:
            assert sample.labels.get("model_name") == server.model, sample
            assert ("engine" in sample.labels) != ("replica" in sample.labels), sample  # an engine's series, or a replica's


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
RAW_BODIES = {
    "completion": {"prompt": PROMPT, "max_tokens": 6, "n": 2, "logprobs": 2, "temperature": 1.0, "seed": 3},
    "completion with echo": {"prompt": PROMPT, "max_tokens": 4, "echo": True, "temperature": 0.0},
    "chat": {"messages": MESSAGES, "max_tokens": 6, "n": 2, "logprobs": True, "top_logprobs": 2, "temperature": 1.0, "seed": 3},
    "chat with a forced tool call": {"messages": MESSAGES, "max_tokens": 24, "tools": [TOOL], "tool_choice": "required", "temperature": 0.0},
}
STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}


def raw_frames(server, path: str, body: dict) -> list[dict]:
    """Every ``data:`` frame of a streamed answer, parsed, up to ``[DONE]`` (which must end it)."""
    with server.http() as http, http.stream("POST", path, json=body | {"stream": True, "stream_options": STREAM_OPTIONS}) as response:
        assert response.status_code == 200, response.read()
        data = [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(frame) for frame in data[:-1]]


@pytest.mark.parametrize("name", list(RAW_BODIES))
def test_raw_bodies_and_chunks_parse_strictly_as_the_sdk_types(server, name):
    """Each whole body and streamed chunk, as sent, validates as the ``openai`` package's own type with
    no field missing and none it does not declare (vLLM's ``stop_reason`` on a choice aside)."""
    chat = name.startswith("chat")
    path, whole_type, chunk_type = ("/v1/chat/completions", ChatCompletion, ChatCompletionChunk) if chat else ("/v1/completions", Completion, CompletionChunk)
    body = RAW_BODIES[name] | {"model": server.model}
    with server.http() as http:
        response = http.post(path, json=body)
    assert response.status_code == 200, response.text
    whole = strict(whole_type, response.json(), VLLM_CHOICE_FIELDS)
    chunks = [strict(chunk_type, frame, VLLM_CHOICE_FIELDS) for frame in raw_frames(server, path, body)]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    if name == "chat with a forced tool call":
        assert whole.choices[0].message.tool_calls[0].function.name == "get_weather"
        assert any(choice.delta.tool_calls for chunk in chunks for choice in chunk.choices)
