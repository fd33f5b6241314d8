"""Reasoning parsers through a real engine that thinks (`tests.thinking_model`): the ingress's request
path in-process (`tests.deployments.served_in_process`), through the ``openai`` and ``anthropic`` SDKs.

The model's greedy output is always ``<think>`` REASONING ``</think>`` ANSWER and EOS (ANSWER alone when
the template closes the thinking), so every split, limit and constraint is checked against exact text.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.deployments.served_in_process import InProcessServer, anthropic_client, openai_client
from tests.thinking_model import ANSWER, REASONING, write_thinking_model

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
ANSWER_WORDS = ["Paris", " is", " it", "."]
"""`ANSWER`'s tokens, one text each."""


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[InProcessServer]:
    server = InProcessServer(str(write_thinking_model(tmp_path_factory.mktemp("thinking-model"))))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def qwen3(served):
    """The openai SDK on a replica with the ``qwen3`` parser."""
    return openai_client(served.ingress(reasoning_parser="qwen3"))


def chat(served, client, **fields):
    return served.run(client.chat.completions.create(model=served.model, messages=MESSAGES, temperature=0, **fields))


def test_without_a_parser_the_tags_are_in_the_content(served):
    client = openai_client(served.ingress())
    message = chat(served, client, max_tokens=32).choices[0].message
    assert message.content == f"<think>{REASONING}</think>{ANSWER}"


def test_chat_splits_reasoning_and_answer_at_the_tags(served, qwen3):
    choice = chat(served, qwen3, max_tokens=32).choices[0]
    extra = choice.message.model_extra
    assert (extra["reasoning_content"], extra["reasoning"], choice.message.content) == (REASONING, REASONING, ANSWER)
    assert choice.finish_reason == "stop"


def test_thinking_off_is_all_answer(served, qwen3):
    choice = chat(served, qwen3, max_tokens=32, extra_body={"chat_template_kwargs": {"enable_thinking": False}}).choices[0]
    assert choice.message.content == ANSWER and not choice.message.model_extra.get("reasoning_content")


def streamed_chat(served, client, **fields) -> tuple[str, str, str | None]:
    """The joined reasoning deltas, content deltas and the finish reason of a streamed chat."""

    async def read() -> tuple[str, str, str | None]:
        reasoning, content, finish = [], [], None
        async for chunk in await client.chat.completions.create(model=served.model, messages=MESSAGES, temperature=0, stream=True, **fields):
            for choice in chunk.choices:
                extra = choice.delta.model_extra or {}
                assert extra.get("reasoning_content") == extra.get("reasoning")
                reasoning.append(extra.get("reasoning_content") or "")
                content.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
        return "".join(reasoning), "".join(content), finish

    return served.run(read())


def test_streamed_chat_deltas_join_to_the_same_split(served, qwen3):
    assert streamed_chat(served, qwen3, max_tokens=32) == (REASONING, ANSWER, "stop")
    for interval in (2, 3, 5):  # frames of several tokens: the tags fall inside a delta, or across two
        client = openai_client(served.ingress(reasoning_parser="qwen3", stream_interval=interval))
        assert streamed_chat(served, client, max_tokens=32) == (REASONING, ANSWER, "stop")
        assert streamed_chat(served, client, max_tokens=2, stop=["capital", " it"]) == (REASONING, "Paris is", "length")


def test_a_stop_string_in_the_thinking_does_not_stop_it_one_in_the_answer_does(served, qwen3):
    assert "capital" in REASONING and "capital" not in ANSWER and " is" in ANSWER and " is" not in REASONING
    for read in (lambda **f: message_split(chat(served, qwen3, **f)), lambda **f: streamed_chat(served, qwen3, **f)):
        assert read(max_tokens=32, stop=["capital"]) == (REASONING, ANSWER, "stop")
        assert read(max_tokens=32, stop=[" is"]) == (REASONING, "Paris", "stop")


def message_split(completion) -> tuple[str, str, str | None]:
    choice = completion.choices[0]
    return choice.message.model_extra.get("reasoning_content") or "", choice.message.content or "", choice.finish_reason


def test_max_tokens_counts_the_answer(served, qwen3):
    for answer_tokens in (1, 2, 3):
        expected = (REASONING, "".join(ANSWER_WORDS[:answer_tokens]), "length")
        assert message_split(chat(served, qwen3, max_tokens=answer_tokens)) == expected
        assert streamed_chat(served, qwen3, max_tokens=answer_tokens) == expected


def test_max_thinking_tokens_bounds_the_thinking(served):
    """The engine stops at max_tokens plus max_thinking_tokens: here inside the thinking, 3 + 2 tokens
    after the prompt (``<think>`` and four words)."""
    client = openai_client(served.ingress(reasoning_parser="qwen3", max_thinking_tokens=2))
    truncated = " ".join(REASONING.split()[:4])
    assert message_split(chat(served, client, max_tokens=3)) == (truncated, "", "length")
    assert streamed_chat(served, client, max_tokens=3) == (truncated, "", "length")
    assert message_split(chat(served, client, max_tokens=16)) == (REASONING, ANSWER, "stop")


def test_a_structured_output_constrains_only_the_answer(served, qwen3):
    """A choice the chain's answer satisfies leaves it as it is; one it does not is forced after ``</think>``,
    and the thinking stays the model's own."""
    satisfied = chat(served, qwen3, max_tokens=32, extra_body={"structured_outputs": {"choice": [ANSWER, "Rome"]}})
    assert message_split(satisfied) == (REASONING, ANSWER, "stop")
    forced = message_split(chat(served, qwen3, max_tokens=32, extra_body={"structured_outputs": {"choice": ["yes", "no"]}}))
    assert forced[0] == REASONING and forced[1] in ("yes", "no") and forced[2] == "stop"
    streamed = streamed_chat(served, qwen3, max_tokens=32, extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert streamed == forced


def test_with_thinking_off_the_constraint_applies_from_the_start(served, qwen3):
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    forced = message_split(chat(served, qwen3, max_tokens=32, extra_body=off | {"structured_outputs": {"choice": ["yes", "no"]}}))
    assert forced[0] == "" and forced[1] in ("yes", "no")


def test_the_deepseek_r1_parser_splits_the_same_output(served):
    """DeepSeek-R1's parser starts in the thinking and drops a ``<think>`` the model writes first."""
    client = openai_client(served.ingress(reasoning_parser="deepseek_r1"))
    assert message_split(chat(served, client, max_tokens=32)) == (REASONING, ANSWER, "stop")
    assert streamed_chat(served, client, max_tokens=32) == (REASONING, ANSWER, "stop")


def test_the_responses_api_returns_a_reasoning_item_then_the_message(served, qwen3):
    response = served.run(qwen3.responses.create(model=served.model, input=MESSAGES[0]["content"], max_output_tokens=32, temperature=0))
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and [part.text for part in reasoning.content] == [REASONING]
    assert message.type == "message" and response.output_text == ANSWER

    async def streamed() -> tuple[str, str]:
        thinking, text = [], []
        async for event in await qwen3.responses.create(model=served.model, input=MESSAGES[0]["content"], max_output_tokens=32, temperature=0, stream=True):
            if event.type == "response.reasoning_text.delta":
                thinking.append(event.delta)
            elif event.type == "response.output_text.delta":
                text.append(event.delta)
        return "".join(thinking), "".join(text)

    assert served.run(streamed()) == (REASONING, ANSWER)


def test_the_messages_api_returns_a_thinking_block_then_the_text(served):
    client = anthropic_client(served.ingress(reasoning_parser="qwen3"))
    message = served.run(client.messages.create(model=served.model, max_tokens=32, messages=MESSAGES, extra_body={"temperature": 0}))
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == REASONING and message.content[1].text == ANSWER and message.stop_reason == "end_turn"

    async def streamed() -> tuple[str, str]:
        thinking, text = [], []
        async with client.messages.stream(model=served.model, max_tokens=32, messages=MESSAGES, extra_body={"temperature": 0}) as stream:
            async for event in stream:
                if event.type == "content_block_delta" and event.delta.type == "thinking_delta":
                    thinking.append(event.delta.thinking)
                elif event.type == "content_block_delta" and event.delta.type == "text_delta":
                    text.append(event.delta.text)
        return "".join(thinking), "".join(text)

    assert served.run(streamed()) == (REASONING, ANSWER)


def test_a_forced_tool_call_comes_after_the_thinking(served, qwen3):
    parameters = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "capital", "parameters": parameters}}]
    for tool_choice in ("required", {"type": "function", "function": {"name": "capital"}}):
        choice = chat(served, qwen3, max_tokens=64, tools=tools, tool_choice=tool_choice, parallel_tool_calls=False).choices[0]
        (call,) = choice.message.tool_calls
        assert choice.message.model_extra["reasoning_content"] == REASONING and not choice.message.content
        assert call.function.name == "capital" and json.loads(call.function.arguments)["city"] in ("Paris", "Rome")
        assert choice.finish_reason == "tool_calls"


def test_the_responses_and_messages_apis_limit_and_stop_the_answer_alone(served, qwen3):
    cut = served.run(qwen3.responses.create(model=served.model, input=MESSAGES[0]["content"], max_output_tokens=2, temperature=0))
    assert [part.text for part in cut.output[0].content] == [REASONING] and cut.output_text == "Paris is"
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    client = anthropic_client(served.ingress(reasoning_parser="qwen3"))

    def message(**fields) -> tuple[str, str, str | None]:
        made = served.run(client.messages.create(model=served.model, messages=MESSAGES, extra_body={"temperature": 0}, **fields))
        thinking, text = made.content
        return thinking.thinking, text.text, made.stop_reason

    assert message(max_tokens=32, stop_sequences=["capital"]) == (REASONING, ANSWER, "end_turn")
    assert message(max_tokens=32, stop_sequences=[" is"]) == (REASONING, "Paris", "stop_sequence")
    assert message(max_tokens=2) == (REASONING, "Paris is", "max_tokens")
