"""Property tests with the default model's real tokenizer: deltas always build the full decode."""

from __future__ import annotations

from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from streaming import HiddenDecoder, split, stream
from tokenizers import Tokenizer, pre_tokenizers

from detok import DetokItem, detokenize_batch, initial_state
from detok.incremental import MAX_PENDING
from sampling.params import SamplingParams

VOCAB = 49152
TRICKY_TEXTS = ["😀", "👩‍👩‍👧", "🇫🇷", "中文字符", "日本語", "é", "ñ", "€", "𝔘", " \t\n", "12345", "<|im_end|>"]


@pytest.fixture(scope="module")
def tricky_ids(tokenizer: Tokenizer) -> list[int]:
    """Single-byte tokens (lone lead and continuation bytes), specials, and pieces of multi-byte text."""
    byte_ids = [tokenizer.token_to_id(c) for c in pre_tokenizers.ByteLevel.alphabet()]
    byte_ids = [i for i in byte_ids if i is not None]  # the vocab lacks bytes UTF-8 never uses
    assert len(byte_ids) > 230
    pieces = [i for text in TRICKY_TEXTS for i in tokenizer.encode(text).ids]
    return sorted(set(byte_ids + pieces + list(range(17))))


def id_sequences(tricky: list[int]) -> st.SearchStrategy[list[int]]:
    segment = st.one_of(
        st.lists(st.sampled_from(tricky), min_size=1, max_size=12),
        st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8),
        st.text(st.sampled_from("aZ 9\n😀中é€👩‍🇫𝔘"), min_size=1, max_size=12).map(lambda s: [("text", s)]),
    )
    return st.lists(segment, max_size=8)


def flatten(tokenizer: Tokenizer, segments: list[list]) -> list[int]:
    ids: list[int] = []
    for seg in segments:
        for x in seg:
            ids.extend(tokenizer.encode(x[1]).ids if isinstance(x, tuple) else [x])
    return ids


@pytest.mark.parametrize("generic", [False, True], ids=["byte-level", "generic-path"])
@settings(max_examples=120, deadline=None)
@given(data=st.data(), sizes=st.lists(st.integers(1, 9), min_size=1, max_size=5), skip=st.booleans())
def test_deltas_concatenate_to_full_decode(tokenizer: Tokenizer, tricky_ids: list[int], generic: bool, data, sizes, skip) -> None:
    ids = flatten(tokenizer, data.draw(id_sequences(tricky_ids)))
    prompt = flatten(tokenizer, data.draw(id_sequences(tricky_ids)))
    full = tokenizer.decode(ids, skip_special_tokens=skip)
    state = initial_state(tokenizer, prompt, SamplingParams(skip_special_tokens=skip))
    result = stream(HiddenDecoder(tokenizer) if generic else tokenizer, state, split(ids, sizes) + [[]])
    sent = ""
    for delta in result.deltas:
        replacements = [len(sent) + k for k, c in enumerate(delta) if c == "\ufffd"]
        sent += delta
        assert full.startswith(sent), "a delta is not final text: it would have to be taken back"
        assert all(full[k] == "\ufffd" for k in replacements)  # implied by the prefix check; stated
    assert sent == full


@settings(max_examples=40, deadline=None)
@given(data=st.data(), skip=st.booleans())
def test_one_batch_many_requests_equals_separate(tokenizer: Tokenizer, tricky_ids: list[int], data, skip) -> None:
    """Requests with different chunkings advanced together in one call each step."""
    seqs = [flatten(tokenizer, data.draw(id_sequences(tricky_ids))) for _ in range(4)]
    chunked = [split(ids, data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))) for ids in seqs]
    states = [initial_state(tokenizer, [], SamplingParams(skip_special_tokens=skip)) for _ in seqs]
    sent = [""] * len(seqs)
    for step in range(max(map(len, chunked), default=0) + 1):
        items = [DetokItem(states[n], chunks[step] if step < len(chunks) else [], finished=step == len(chunks)) for n, chunks in enumerate(chunked)]
        for n, result in enumerate(detokenize_batch(tokenizer, items)):
            if step <= len(chunked[n]):
                sent[n] += result.text
                states[n] = result.state
    assert sent == [tokenizer.decode(ids, skip_special_tokens=skip) for ids in seqs]


@pytest.mark.parametrize("byte_chars", ["Ģ", "âĤ", "ð", "Ã"])
def test_undecodable_streams_stay_bounded_and_exact(tokenizer: Tokenizer, byte_chars: str) -> None:
    """Invalid bytes forever (lone continuation or lead bytes, truncated sequences): bounded window, exact text."""
    ids = [tokenizer.token_to_id(c) for c in byte_chars] * 300 + tokenizer.encode(" ok").ids
    state = initial_state(tokenizer, [], SamplingParams())
    result = stream(tokenizer, state, [[i] for i in ids] + [[]])
    assert result.text == tokenizer.decode(ids)
    assert max(len(r.state.window) for r in result.results) <= MAX_PENDING + 8


def test_rebase_never_cuts_inside_a_sequence(tokenizer: Tokenizer) -> None:
    """The first rebase candidate cuts F0|9F, inside an incomplete sequence; text stays exact."""
    lead, cont = tokenizer.token_to_id("ð"), tokenizer.token_to_id("Ł")
    ids = [lead] * (MAX_PENDING - 3) + [cont] + [lead] * 10 + tokenizer.encode(" ok").ids
    result = stream(tokenizer, initial_state(tokenizer, [], SamplingParams()), [[i] for i in ids] + [[]])
    assert result.text == tokenizer.decode(ids)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), sizes=st.lists(st.integers(1, 6), min_size=1, max_size=4), skip=st.booleans())
def test_fast_path_matches_general_path(tokenizer: Tokenizer, tricky_ids: list[int], data, sizes, skip) -> None:
    """The no-decode fast path returns exactly the general path's texts and states."""
    ids = flatten(tokenizer, data.draw(id_sequences(tricky_ids)))
    stops = data.draw(st.lists(st.sampled_from(["a", "😀", "中文", "\n\n", "ab"]), max_size=2))
    min_tokens = data.draw(st.integers(0, 5))
    params = SamplingParams(skip_special_tokens=skip, stop=stops, min_tokens=min_tokens, max_tokens=None)
    chunks = split(ids, sizes) + [[]]
    fast_state = general_state = initial_state(tokenizer, [], params)
    for n, chunk in enumerate(chunks):
        item_args = (chunk, n == len(chunks) - 1)
        (fast,) = detokenize_batch(tokenizer, [DetokItem(fast_state, *item_args)])
        with mock.patch("detok.batch.fast_result", return_value=None):
            (general,) = detokenize_batch(tokenizer, [DetokItem(general_state, *item_args)])
        assert fast == general
        fast_state = general_state = fast.state
        if fast.stop is not None:
            break
