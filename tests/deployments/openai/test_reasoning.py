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

from deployments.anthropic.messages_writer import MessageBuilder, MessageFrames, message_body
from deployments.openai.choices import CompletionFrames, completion_body
from deployments.openai.output_events import ChoiceDelta, stream_frames
from deployments.openai.protocol import StreamUsage
from deployments.openai.reasoning import REASONING_PARSERS, ReasoningSplitter, answer_budget, constrained_after_thinking
from deployments.openai.responses import ResponseFormat
from deployments.openai.responses_writer import ResponseBuilder, ResponseFrames, response_body
from detok import AnswerRules, StopHit, ThinkingTags, initial_state
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
        frames = [f async for f in stream_frames(CompletionFrames(fmt, [""], lambda n: {}, StreamUsage(False, False)), deltas_for(pieces_of(TEXT, cuts)))]
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
            [f async for f in stream_frames(ResponseFrames(ResponseBuilder("resp_1", "m", echo, 3), None, parser), deltas_for(pieces))],
            await response_body(ResponseBuilder("resp_1", "m", echo, 3), None, deltas_for(pieces), parser),
            [f async for f in stream_frames(MessageFrames(MessageBuilder("msg_1", "m", 3), None, parser), deltas_for(pieces))],
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


def answer_stream(parser: str, text: str, sizes: list[int], stop: list[str], max_tokens: int | None, include_stop: bool = False):
    """The detokenizer's deltas for ``text``'s ids cut into engine messages of ``sizes``, with the answer's
    rules: the text sent, the ids kept, and the hit that ended it (None: the output ran to its end)."""
    ids = THINK_TOKENIZER.encode(text, add_special_tokens=False).ids
    params = SamplingParams(stop=stop, include_stop_str_in_output=include_stop)
    rules = answer_budget(SamplingParams(max_tokens=max_tokens), REASONING_PARSERS[parser], None)[1]
    state = initial_state(THINK_TOKENIZER, THINK_TOKENIZER.encode("Question:").ids, params, rules)
    out = stream(THINK_TOKENIZER, state, split_ids(ids, sizes))
    hit = out.final.stop
    chunks = split_ids(ids, sizes)[: len(out.results)]
    kept = sum(map(len, chunks)) - (len(chunks[-1]) - hit.keep_tokens if hit is not None else 0)
    return out.deltas, kept, hit


def expected_answer_end(parser: str, text: str, stop: list[str], max_tokens: int | None) -> tuple[int, str | None]:
    """Found by brute force on the output's prefixes: how many ids the output keeps, and the stop string
    that ends it (None: its length, or its end)."""
    ids = THINK_TOKENIZER.encode(text, add_special_tokens=False).ids
    answer_from = None
    for k in range(len(ids) + 1):
        prefix = THINK_TOKENIZER.decode(ids[:k])
        reasoning, answer = split(parser, [prefix])
        opened = prefix.startswith("<think>") or REASONING_PARSERS[parser].starts_in_reasoning
        if answer_from is None and (not opened and not "<think>".startswith(prefix) or "</think>" in prefix):
            answer_from = k if opened else 0
        found = [s for s in stop if s in answer]
        if found and answer_from is not None:
            return k, min(found, key=answer.find)
        undecided = answer_from is None and not opened
        if max_tokens is not None and (answer_from is not None or undecided) and k >= (answer_from or 0) + max_tokens and k < len(ids):
            return k, None
    return len(ids), None


ANSWER_TEXTS = [
    "<think>\nA city, as asked: a capital.\n</think>\n\nParis, a capital.",
    "So: a city.</think>Paris, a capital, and a city.",
    "Paris, a city: a capital.",
    "<think>Café 🙂 a city?</think>🙂 Café, a capital 🙂.",
]


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["qwen3", "deepseek_r1"]),
    st.sampled_from(ANSWER_TEXTS),
    st.lists(st.integers(1, 5), min_size=1, max_size=6),
    st.sampled_from([[], ["a"], [", a"], ["capital", "Par"], ["</think>"], ["city"]]),
    st.one_of(st.none(), st.integers(1, 12)),
    st.booleans(),
)
def test_stop_strings_and_max_tokens_apply_to_the_answer_whatever_the_split(parser, text, sizes, stop, max_tokens, include_stop):
    """Stop strings are looked for in the answer only, and max_tokens counts the answer's ids, exactly
    under every split of the ids into engine messages: the ids kept and the text sent are those of the
    shortest prefix of the output whose answer holds a stop string, or whose answer has max_tokens ids."""
    deltas, kept, hit = answer_stream(parser, text, sizes, stop, max_tokens, include_stop)
    expected_kept, expected_stop = expected_answer_end(parser, text, stop, max_tokens)
    ids = THINK_TOKENIZER.encode(text, add_special_tokens=False).ids
    reasoning, answer = split(parser, deltas)
    whole_reasoning, whole_answer = split(parser, [THINK_TOKENIZER.decode(ids[:expected_kept])])
    if expected_stop is not None:
        whole_answer = whole_answer[: whole_answer.find(expected_stop) + (len(expected_stop) if include_stop else 0)]
        assert hit == StopHit(expected_stop, hit.keep_tokens)
    elif expected_kept < len(ids):
        assert hit == StopHit(None, hit.keep_tokens)  # the answer's length
    else:
        assert hit is None
    assert (reasoning, answer) == (whole_reasoning, whole_answer)
    assert kept == expected_kept


def test_stop_strings_in_the_thinking_do_not_end_it():
    deltas, kept, hit = answer_stream("deepseek_r1", ANSWER_TEXTS[1], [1], ["city"], None)
    assert split("deepseek_r1", deltas) == ("So: a city.", "Paris, a capital, and a ")
    assert hit == StopHit("city", 1)


def test_max_tokens_counts_the_answer_and_the_engine_gets_the_thinking_budget():
    parser = REASONING_PARSERS["qwen3"]
    params, rules = answer_budget(SamplingParams(max_tokens=5), parser, 100)
    assert params.max_tokens == 105 and rules == AnswerRules(ThinkingTags("<think>", "</think>", False), 5)
    assert answer_budget(SamplingParams(max_tokens=5), parser, None)[0].max_tokens is None  # the context bounds the thinking
    assert answer_budget(SamplingParams(max_tokens=None), parser, 100)[0].max_tokens is None
    beams = SamplingParams(max_tokens=5, use_beam_search=True, n=2, temperature=0.0)
    assert answer_budget(beams, parser, 100) == (beams, AnswerRules(parser.tags, None))  # a beam search's length counts all
    deltas, kept, hit = answer_stream("qwen3", ANSWER_TEXTS[0], [3], [], 2)
    ids = THINK_TOKENIZER.encode(ANSWER_TEXTS[0], add_special_tokens=False).ids
    thinking = ids.index(THINK_TOKENIZER.token_to_id("</think>")) + 1
    assert kept == thinking + 2 and hit == StopHit(None, hit.keep_tokens)
    assert "".join(deltas) == THINK_TOKENIZER.decode(ids[: thinking + 2])
