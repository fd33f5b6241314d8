"""Stop strings: same outcome for every split into calls, earliest completion wins, prompt ignored, min_tokens."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

import pytest
from streaming import stream
from tokenizers import Tokenizer

from detok import DetokItem, detokenize_batch, initial_state
from sampling.params import SamplingParams


def compositions(ids: list[int]) -> Iterator[list[list[int]]]:
    """Every way to cut ``ids`` into consecutive non-empty chunks."""
    for mask in range(2 ** (len(ids) - 1)):
        chunks, start = [], 0
        for i in range(1, len(ids)):
            if mask >> (i - 1) & 1:
                chunks.append(ids[start:i])
                start = i
        yield [*chunks, ids[start:]]


def completing_token(tokenizer: Tokenizer, ids: list[int], stop: str, after: int = 0) -> int:
    """1-based index of the first id whose text completes ``stop`` (ending past char ``after``)."""
    return next(k for k in range(1, len(ids) + 1) if tokenizer.decode(ids[:k]).find(stop, after) >= 0)


CASES = [
    ("The answer is 42. Done now", "wer is"),
    ("The answer is 42. Done now", "42."),
    ("ok 😀 end now", "😀 end"),
    ("ok 😀 end now", "ok"),
]


@pytest.mark.parametrize(("text", "stop"), CASES)
@pytest.mark.parametrize("include", [False, True])
def test_every_split_gives_same_output_and_hit(tokenizer: Tokenizer, text: str, stop: str, include: bool) -> None:
    ids = tokenizer.encode(text).ids
    params = SamplingParams(stop=[stop, "never"], include_stop_str_in_output=include)
    cut = text.index(stop) + (len(stop) if include else 0)
    kept = completing_token(tokenizer, ids, stop)
    for chunks in compositions(ids):
        result = stream(tokenizer, initial_state(tokenizer, [], params), chunks)
        assert result.text == text[:cut]
        assert result.final.stop is not None and result.final.stop.stop == stop
        assert result.final.state.num_output_tokens == kept
        assert sum(map(len, chunks[: len(result.results) - 1])) + result.final.stop.keep_tokens == kept
        assert result.final.state.done


@pytest.mark.parametrize("stops", [["abcdefg", "cde"], ["cde", "abcdefg"]])
def test_later_starting_stop_that_completes_first_wins(tokenizer: Tokenizer, stops: list[str]) -> None:
    ids = tokenizer.encode("xabcdefgh").ids
    for chunks in compositions(ids):
        result = stream(tokenizer, initial_state(tokenizer, [], SamplingParams(stop=stops)), chunks)
        assert (result.text, result.final.stop.stop) == ("xab", "cde")


def test_stop_in_prompt_or_straddling_it_is_ignored(tokenizer: Tokenizer) -> None:
    params = SamplingParams(stop=["STOP"])
    prompt = tokenizer.encode("Say STOP please, ST").ids
    ids = tokenizer.encode("OP more").ids
    result = stream(tokenizer, initial_state(tokenizer, prompt, params), [[i] for i in ids])
    assert result.text == "OP more" and result.final.stop is None


@pytest.mark.parametrize("min_tokens", range(0, 8))
def test_min_tokens(tokenizer: Tokenizer, min_tokens: int) -> None:
    """A stop counts only if it completes after ``min_tokens`` output tokens (vLLM's rule, and the
    sampler's: stop ids are banned until ``min_tokens`` are out)."""
    text = "a STOP b STOP c"
    ids = tokenizer.encode(text).ids
    first, second = completing_token(tokenizer, ids, "STOP"), completing_token(tokenizer, ids, "STOP", 3)
    expected = text[:2] if min_tokens < first else text[:9] if min_tokens < second else text
    params = SamplingParams(stop=["STOP"], min_tokens=min_tokens, max_tokens=None)
    for chunks in compositions(ids):
        result = stream(tokenizer, initial_state(tokenizer, [], params), chunks)
        assert result.text == expected
        assert (result.final.stop is None) == (min_tokens >= second)


def test_holds_back_while_streaming_and_flushes_on_finish(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("no stop here at all").ids
    params = SamplingParams(stop=["STOP!", "xyzzy"])
    result = stream(tokenizer, initial_state(tokenizer, [], params), [[i] for i in ids], finish=False)
    assert len(result.final.state.stop_tail) == 4
    assert result.text + result.final.state.stop_tail == "no stop here at all"
    (flushed,) = detokenize_batch(tokenizer, [DetokItem(result.final.state, [], finished=True)])
    assert result.text + flushed.text == "no stop here at all" and flushed.state.stop_tail == ""


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "general-path"])
def test_include_stop_str_streams_at_once(tokenizer: Tokenizer, fast: bool) -> None:
    """With the stop sent as text anyway, nothing is held back; a stop across calls still ends it."""
    text = "no stop here at all, then STOP! and more"
    ids = tokenizer.encode(text).ids
    params = SamplingParams(stop=["STOP!", "xyzzy"], include_stop_str_in_output=True)
    state, sent = initial_state(tokenizer, [], params), ""
    with mock.patch("detok.batch.fast_result", return_value=None) if not fast else contextlib.nullcontext():
        for k, i in enumerate(ids, start=1):
            (result,) = detokenize_batch(tokenizer, [DetokItem(state, [i])])
            sent, state = sent + result.text, result.state
            if result.stop is not None:
                break
            assert sent == tokenizer.decode(ids[:k])
    assert sent == text[: text.index("STOP!") + 5] and result.stop is not None
