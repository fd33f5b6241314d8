"""Reasoning split exactly whatever the split of the text into deltas, and of the output's tokens into
engine messages through the detokenizer (issue 28 item 3); chat, Responses and Messages write it."""

from __future__ import annotations

import asyncio
import json

import pytest
from anthropic.types import Message, RawMessageStreamEvent
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses import Response, ResponseStreamEvent
from tokenizers import AddedToken, Tokenizer

from deployments.anthropic.messages_writer import MessageBuilder, message_body, message_frames
from deployments.openai.choices import completion_body, completion_frames
from deployments.openai.output_events import ChoiceDelta
from deployments.openai.protocol import StreamUsage
from deployments.openai.reasoning import REASONING_PARSERS, ReasoningSplitter, constrained_after_thinking
from deployments.openai.responses import ResponseFormat
from deployments.openai.responses_writer import ResponseBuilder, response_body, response_frames
from detok import initial_state
from sampling.params import SamplingParams
from tests.deployments.openai.test_responses_writer import events_of, request
from tests.detok.streaming import split as split_ids
from tests.detok.streaming import stream
from tests.engine.test_chat_tokenizer import TOKENIZER
from tests.sdk_types import strict

CASES = [
    ("deepseek_r1", "<think>\nLet me see.\n</think>\n\nParis.", "\nLet me see.\n", "\n\nParis."),
    ("deepseek_r1", "Let me see.</think>Paris.", "Let me see.", "Paris."),
    ("deepseek_r1", "Still thinking <thi", "Still thinking <thi", ""),
    ("qwen3", "<think>a < b </thi</think>Yes", "a < b </thi", "Yes"),
    ("qwen3", "Paris, no thinking.", "", "Paris, no thinking."),
    ("qwen3", "<thin", "", "<thin"),
    ("deepseek_r1", "", "", ""),
]


def split(parser: str, pieces: list[str]) -> tuple[str, str]:
    splitter = ReasoningSplitter(REASONING_PARSERS[parser])
    reasoning = answer = ""
    for i, piece in enumerate(pieces):
        r, a = splitter.feed(piece, finished=i == len(pieces) - 1)
        reasoning, answer = reasoning + r, answer + a
    return reasoning, answer


@pytest.mark.parametrize(("parser", "text", "reasoning", "answer"), CASES)
def test_whole_text(parser, text, reasoning, answer):
    assert split(parser, [text]) == (reasoning, answer)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(CASES), st.data())
def test_every_split_of_the_text_gives_the_same_reasoning_and_answer(case, data):
    parser, text, reasoning, answer = case
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=8)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    assert split(parser, pieces) == (reasoning, answer)


TEXT = "<think>\nThe user asks for a city.\n</think>\n\nParis."


def deltas_for(pieces: list[str]):

    async def deltas():
        for i, piece in enumerate(pieces):
            yield {0: ChoiceDelta(text=piece, token_ids=[7], finish_reason="stop" if i == len(pieces) - 1 else None)}

    return deltas()


def pieces_of(text: str, cuts: list[int]) -> list[str]:
    cuts = sorted(set(cuts))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


CUTS = st.lists(st.integers(1, len(TEXT) - 1), max_size=8)


@settings(max_examples=50, deadline=None)
@given(CUTS)
def test_chat_streams_reasoning_content_and_content_apart_whatever_the_split(cuts):

    fmt = ResponseFormat.new("chatcmpl-1", "m", chat=True, reasoning=REASONING_PARSERS["qwen3"])

    async def both():
        frames = [f async for f in completion_frames(fmt, [""], deltas_for(pieces_of(TEXT, cuts)), lambda n: {}, StreamUsage(False, False))]
        whole = await completion_body(fmt, [""], deltas_for(pieces_of(TEXT, cuts)), lambda n: {})
        return frames, whole

    frames, whole = asyncio.run(both())
    chunks = [json.loads(line[6:]) for f in frames for line in f.split("\n") if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "\nThe user asks for a city.\n" == whole["choices"][0]["message"]["reasoning_content"]
    assert "".join(d.get("reasoning", "") for d in deltas) == whole["choices"][0]["message"]["reasoning"]
    assert "".join(d.get("content") or "" for d in deltas) == "\n\nParis." == whole["choices"][0]["message"]["content"]


@settings(max_examples=30, deadline=None)
@given(CUTS)
def test_responses_and_messages_write_reasoning_items_and_thinking_blocks(cuts):

    parser = REASONING_PARSERS["qwen3"]
    echo = request().echo_fields()

    async def run():
        pieces = pieces_of(TEXT, cuts)
        return (
            [f async for f in response_frames(ResponseBuilder("resp_1", "m", echo, 3), None, deltas_for(pieces), parser)],
            await response_body(ResponseBuilder("resp_1", "m", echo, 3), None, deltas_for(pieces), parser),
            [f async for f in message_frames(MessageBuilder("msg_1", "m", 3), None, deltas_for(pieces), parser)],
            await message_body(MessageBuilder("msg_1", "m", 3), None, deltas_for(pieces), parser),
        )

    response_stream, response, message_stream, message = asyncio.run(run())
    events = [strict(ResponseStreamEvent, e) for e in events_of(response_stream)]
    final = strict(Response, response)
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output[0].content[0].text == "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "\nThe user asks for a city.\n"
    assert final.output_text == "\n\nParis." == events[-1].response.output_text
    for event in events_of(message_stream):
        strict(RawMessageStreamEvent, event)
    whole = strict(Message, message)
    assert [block.type for block in whole.content] == ["thinking", "text"]
    assert whole.content[0].thinking == "\nThe user asks for a city.\n" and whole.content[1].text == "\n\nParis."


def think_tokenizer():
    """The default model's tokenizer with ``<think>`` and ``</think>`` as added tokens (not special: they
    reach the text, as in DeepSeek-R1's and Qwen3's tokenizers)."""

    tokenizer = Tokenizer.from_str(TOKENIZER.tokenizer.to_str())
    tokenizer.add_tokens([AddedToken("<think>", special=False), AddedToken("</think>", special=False)])
    return tokenizer


THINK_TOKENIZER = think_tokenizer()


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["qwen3", "deepseek_r1"]), st.lists(st.integers(1, 4), min_size=1, max_size=6))
def test_the_split_is_exact_whatever_the_split_of_tokens_into_engine_messages(parser, sizes):
    """The detokenizer's deltas for any split of the output's ids into engine messages, through the splitter."""

    ids = THINK_TOKENIZER.encode(TEXT, add_special_tokens=False).ids
    assert THINK_TOKENIZER.token_to_id("</think>") in ids
    state = initial_state(THINK_TOKENIZER, THINK_TOKENIZER.encode("Question:").ids, SamplingParams())
    deltas = stream(THINK_TOKENIZER, state, split_ids(ids, sizes)).deltas
    assert "".join(deltas) == TEXT
    assert split(parser, deltas) == ("\nThe user asks for a city.\n", "\n\nParis.")


def test_a_constraint_applies_after_the_thinking_unless_the_prompt_closed_it():
    params = SamplingParams(structured_outputs={"json": {"type": "object"}})
    thinking = constrained_after_thinking(params, "<|im_start|>assistant\n<think>\n")
    assert thinking.structured_outputs.reasoning_end == "</think>" and thinking.structured_outputs.json_ == {"type": "object"}
    assert thinking.structured_outputs.key != params.structured_outputs.key  # compiled apart
    assert constrained_after_thinking(params, "assistant\n<think>\n\n</think>\n\n") is params  # thinking off (Qwen3)
    assert constrained_after_thinking(SamplingParams(), "<think>\n").structured_outputs is None
