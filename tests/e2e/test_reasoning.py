"""Reasoning over HTTP through Ray Serve (issue 28, item 3): a second app, served at route ``/think``
beside the default model's, runs a model that thinks (`tests.thinking_model`) with the ``qwen3``
reasoning parser. Every body and streamed event, as sent through HAProxy and the ingress replica, is
parsed strictly by the SDK's own types: for chat, the ``openai`` types with ``reasoning_content`` and
``reasoning`` (which the SDK does not declare, as vLLM's ``stop_reason``) allowed on the message and
the delta alone.

The model's greedy output is always ``<think>`` REASONING ``</think>`` ANSWER and EOS, so every split is
checked against exact text.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent

from bench.lib.serve_cluster import ServeCluster
from deployments import build_app
from deployments.driver import wait_until_healthy
from tests.e2e.conftest import API_KEY, STARTUP_TIMEOUT_S, Server
from tests.e2e.test_agent_apis import anthropic_client, raw_events
from tests.e2e.test_openai_client import raw_frames
from tests.sdk_types import VLLM_CHOICE_FIELDS, strict
from tests.thinking_model import ANSWER, REASONING, write_thinking_model

APP, ROUTE, MODEL = "spout-think", "/think", "thinker"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
REASONING_FIELDS = frozenset({"reasoning_content", "reasoning"})
CHAT_FIELDS = {**VLLM_CHOICE_FIELDS, "ChatCompletionMessage": REASONING_FIELDS, "ChoiceDelta": REASONING_FIELDS}
"""What a chat with a reasoning parser adds to the SDK's types: vLLM's fields, where vLLM writes them."""


@pytest.fixture(scope="module")
def thinker(cluster: ServeCluster, server: Server, tmp_path_factory) -> Iterator[Server]:
    """The thinking model's app at `ROUTE` on the session's cluster (after the default app, whose
    engine it shares the machine with), deleted with its engine when the module ends."""
    folder = write_thinking_model(tmp_path_factory.mktemp("thinking-model"))
    options = {"model": str(folder), "served_model_name": MODEL, "api_key": API_KEY, "reasoning_parser": "qwen3", "max_num_seqs": 8, "max_model_len": 256}
    port = cluster.deploy(build_app(options), APP, timeout_s=STARTUP_TIMEOUT_S, route_prefix=ROUTE)
    base_url = f"http://127.0.0.1:{port}{ROUTE}"
    try:
        wait_until_healthy(base_url, STARTUP_TIMEOUT_S)
        yield Server(base_url=base_url, direct_url=f"http://127.0.0.1:{cluster.direct_port(APP)}{ROUTE}", model=MODEL, api_key=API_KEY, app=APP)
    finally:
        cluster.delete(APP)


def test_chat_whole_and_streamed_split_exactly_and_parse_strictly(thinker):
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 32, "temperature": 0.0}
    with thinker.http() as http:
        response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    message = strict(ChatCompletion, response.json(), CHAT_FIELDS).choices[0].message
    assert (message.model_extra["reasoning_content"], message.model_extra["reasoning"], message.content) == (REASONING, REASONING, ANSWER)
    chunks = [strict(ChatCompletionChunk, frame, CHAT_FIELDS) for frame in raw_frames(thinker, "/v1/chat/completions", body)]
    deltas = [choice.delta for chunk in chunks for choice in chunk.choices]
    assert all((delta.model_extra or {}).get("reasoning_content") == (delta.model_extra or {}).get("reasoning") for delta in deltas)
    assert "".join((delta.model_extra or {}).get("reasoning_content") or "" for delta in deltas) == REASONING
    assert "".join(delta.content or "" for delta in deltas) == ANSWER


def test_stop_strings_and_thinking_off_through_the_sdk(thinker):
    client = thinker.openai()

    def split(**fields) -> tuple[str, str | None, str | None]:
        choice = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=32, temperature=0.0, **fields).choices[0]
        return choice.message.model_extra.get("reasoning_content") or "", choice.message.content, choice.finish_reason

    assert split(stop=["capital"]) == (REASONING, ANSWER, "stop")  # a stop string in the thinking does not stop it
    assert split(stop=[" is"]) == (REASONING, "Paris", "stop")
    assert split(extra_body={"chat_template_kwargs": {"enable_thinking": False}}) == ("", ANSWER, "stop")


def test_the_responses_api_streams_a_reasoning_item_then_the_message(thinker):
    body = {"model": MODEL, "input": MESSAGES[0]["content"], "max_output_tokens": 32, "temperature": 0.0}
    with thinker.http() as http:
        whole = strict(Response, http.post("/v1/responses", json=body).json())
    reasoning, message = whole.output
    assert reasoning.type == "reasoning" and [part.text for part in reasoning.content] == [REASONING]
    assert message.type == "message" and whole.output_text == ANSWER
    events = [strict(ResponseStreamEvent, event) for event in raw_events(thinker, "/v1/responses", body)]
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == REASONING
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == ANSWER
    assert events[-1].type == "response.completed" and events[-1].response.output_text == ANSWER


def test_the_messages_api_streams_a_thinking_block_then_the_text(thinker):
    kwargs = {"model": MODEL, "messages": MESSAGES, "max_tokens": 32}
    whole = anthropic_client(thinker).messages.create(**kwargs, extra_body={"temperature": 0.0})
    strict(Message, whole.model_dump(mode="json", exclude_unset=True))
    assert [block.type for block in whole.content] == ["thinking", "text"]
    assert (whole.content[0].thinking, whole.content[1].text, whole.stop_reason) == (REASONING, ANSWER, "end_turn")
    raw = raw_events(thinker, "/v1/messages", kwargs | {"temperature": 0.0}, {"x-api-key": API_KEY})
    events = [strict(RawMessageStreamEvent, event) for event in raw]
    deltas = [event.delta for event in events if event.type == "content_block_delta"]
    assert "".join(d.thinking for d in deltas if d.type == "thinking_delta") == REASONING
    assert "".join(d.text for d in deltas if d.type == "text_delta") == ANSWER


def test_the_two_apps_route_apart(thinker, server):
    """Each app answers under its own route with its own model; the default app's model is unknown under `ROUTE`."""
    assert [card.id for card in thinker.openai().models.list().data] == [MODEL]
    assert [card.id for card in server.openai().models.list().data] == [server.model]
    with thinker.http() as http:
        response = http.post("/v1/chat/completions", json={"model": server.model, "messages": MESSAGES, "max_tokens": 1})
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
