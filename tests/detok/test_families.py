"""Exact streamed text for every decoder family, with tokenizers built in the tests.

The invariant, for any ids, prompt and split into calls: the deltas concatenate to the text
of the output ids as ``decode`` renders it after text (with its leading space; from the
start when the prompt renders no text), every delta is final (no U+FFFD that the final text
does not hold there), and a stop string, its kept-token count and the finish do not depend
on the split.
"""

from __future__ import annotations

import random
from unittest import mock

import pytest
from families import FAMILIES, Family
from hypothesis import given, settings
from hypothesis import strategies as st
from streaming import split, stream

from detok import DetokItem, detokenize_batch, initial_state
from sampling.params import SamplingParams

CHARS = "aZ é中😀👩‍🇫𝔘€"


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request) -> Family:
    return FAMILIES[request.param]()


def id_sequences(family: Family) -> st.SearchStrategy[list[int]]:
    """Words, specials, and (where the family has byte tokens) runs of valid and of random bytes."""
    segments = [
        st.lists(st.sampled_from(family.word_ids), min_size=1, max_size=6),
        st.lists(st.sampled_from(family.special_ids), min_size=1, max_size=2),
        st.lists(st.integers(0, family.tokenizer.get_vocab_size() - 1), min_size=1, max_size=6),
    ]
    if family.byte_ids:
        segments.append(st.text(st.sampled_from(CHARS), min_size=1, max_size=8).map(lambda s: family.ids_of_bytes(s.encode())))
        segments.append(st.binary(min_size=1, max_size=4).map(family.ids_of_bytes))
    return st.lists(st.one_of(segments), max_size=8).map(lambda segs: [i for seg in segs for i in seg])


def output_text(family: Family, prompt: list[int], ids: list[int], skip: bool) -> str:
    """The output ids' text after the prompt: after a separator word if the prompt renders text."""
    tokenizer = family.tokenizer
    if not tokenizer.decode(prompt + [family.separator], skip_special_tokens=skip).endswith(tokenizer.decode([family.separator])):
        return tokenizer.decode(ids, skip_special_tokens=skip)  # pragma: no cover - the separator always renders
    renders = any(not (skip and i in family.special_ids) for i in prompt)
    if not renders:
        return tokenizer.decode(ids, skip_special_tokens=skip)
    before = tokenizer.decode([family.separator], skip_special_tokens=skip)
    return tokenizer.decode([family.separator, *ids], skip_special_tokens=skip)[len(before) :]


def assert_final_deltas(deltas: list[str], full: str) -> None:
    sent = ""
    for delta in deltas:
        sent += delta
        assert full.startswith(sent), f"delta {delta!r} is not final text: it would have to be taken back"
    assert sent == full


@settings(max_examples=150, deadline=None)
@given(data=st.data(), sizes=st.lists(st.integers(1, 9), min_size=1, max_size=5), skip=st.booleans())
def test_deltas_are_final_and_build_the_text(family: Family, data, sizes, skip) -> None:
    ids, prompt = data.draw(id_sequences(family)), data.draw(id_sequences(family))
    state = initial_state(family.tokenizer, prompt, SamplingParams(skip_special_tokens=skip))
    result = stream(family.tokenizer, state, split(ids, sizes) + [[]])
    full = output_text(family, prompt, ids, skip)
    assert_final_deltas(result.deltas, full)
    last = prompt[-1] if prompt else None
    if last in family.word_ids and not (skip and last in family.special_ids):
        before = family.tokenizer.decode(prompt, skip_special_tokens=skip)
        assert full == family.tokenizer.decode(prompt + ids, skip_special_tokens=skip)[len(before) :]


@settings(max_examples=150, deadline=None)
@given(data=st.data(), sizes=st.lists(st.integers(1, 9), min_size=1, max_size=5), include=st.booleans())
def test_stop_strings_do_not_depend_on_the_split(family: Family, data, sizes, include) -> None:
    ids = data.draw(id_sequences(family))
    full = family.tokenizer.decode(ids)
    stop_at = data.draw(st.integers(0, max(0, len(full) - 1)))
    stop = full[stop_at : stop_at + data.draw(st.integers(1, 4))] or "zz"
    params = SamplingParams(stop=[stop], include_stop_str_in_output=include)
    one_by_one = stream(family.tokenizer, initial_state(family.tokenizer, [], params), [[i] for i in ids] + [[]])
    chunked = stream(family.tokenizer, initial_state(family.tokenizer, [], params), split(ids, sizes) + [[]])
    assert chunked.text == one_by_one.text
    assert (chunked.final.stop and chunked.final.stop.stop) == (one_by_one.final.stop and one_by_one.final.stop.stop)
    assert chunked.final.state.num_output_tokens == one_by_one.final.state.num_output_tokens
    index = full.find(stop)
    expected = full if index < 0 else full[: index + len(stop) if include else index]
    assert one_by_one.text == expected
    assert (one_by_one.final.stop is not None) == (index >= 0)


def test_a_byte_run_longer_than_any_context_stays_exact() -> None:
    """Issue 13: an emoji then CJK as byte tokens, then words; no U+FFFD, nothing lost."""
    family = FAMILIES["byte-fallback"]()
    hello, the, again = (family.tokenizer.token_to_id(word) for word in ("▁Hello", "▁the", "▁again"))
    ids = [hello, *family.ids_of_bytes("😀中文字".encode()), the, again]
    for chunks in ([[i] for i in ids], split(ids, [3]), [ids]):
        result = stream(family.tokenizer, initial_state(family.tokenizer, [], SamplingParams()), chunks)
        assert result.text == family.tokenizer.decode(ids) == "Hello😀中文字 the again"
        assert all("\ufffd" not in delta for delta in result.deltas)


def test_prompt_ending_in_a_byte_run_keeps_the_leading_space() -> None:
    family = FAMILIES["byte-fallback"]()
    world = family.tokenizer.token_to_id("▁world")
    prompt = [family.tokenizer.token_to_id("▁Hello"), *family.ids_of_bytes("😀中".encode())]
    result = stream(family.tokenizer, initial_state(family.tokenizer, prompt, SamplingParams()), [[world]])
    assert result.text == " world" == family.tokenizer.decode(prompt + [world])[len("Hello😀中") :]


def test_stop_inside_a_byte_run_is_found_at_the_same_id_in_one_call() -> None:
    family = FAMILIES["byte-fallback"]()
    again = family.tokenizer.token_to_id("▁again")
    ids = [again, *family.ids_of_bytes("😀中".encode()), again, again]
    params = SamplingParams(stop=["中"])
    results = [stream(family.tokenizer, initial_state(family.tokenizer, [], params), chunks) for chunks in ([[i] for i in ids], [ids])]
    assert [r.text for r in results] == ["again😀"] * 2
    assert [r.final.state.num_output_tokens for r in results] == [9, 9]  # the run is final once "▁again" ends it


def test_ten_thousand_random_ids_per_family(family: Family) -> None:
    rng = random.Random(13)
    pools = [family.word_ids, family.special_ids, list(family.byte_ids) or family.word_ids]
    ids = [rng.choice(rng.choices(pools, weights=[6, 1, 3])[0]) for _ in range(10_000)]
    chunks = split(ids, [rng.randint(1, 8) for _ in range(64)])
    result = stream(family.tokenizer, initial_state(family.tokenizer, [], SamplingParams()), chunks + [[]])
    assert_final_deltas(result.deltas, family.tokenizer.decode(ids))


def test_logprob_strings_keep_the_leading_space(family: Family) -> None:
    tokenizer = family.tokenizer
    ids = sorted(family.word_ids + family.special_ids + list(family.byte_ids)[:40])
    state = initial_state(tokenizer, [], SamplingParams())
    (result,) = detokenize_batch(tokenizer, [DetokItem(state, [], logprob_token_ids=ids)])
    for i, string in zip(ids, result.token_strings):
        if i in family.byte_ids:
            assert string.bytes == bytes([family.byte_ids[i]])
        else:
            text = tokenizer.decode([family.separator, i], skip_special_tokens=False)[len(tokenizer.decode([family.separator])) :]
            assert string.text == text and string.bytes == text.encode()
    texts = [s.text for i, s in zip(ids, result.token_strings) if i not in family.byte_ids]
    assert len(set(texts)) == len(texts), "two tokens share a top_logprobs key"


@settings(max_examples=100, deadline=None)
@given(data=st.data(), sizes=st.lists(st.integers(1, 6), min_size=1, max_size=4), skip=st.booleans())
def test_fast_path_matches_general_path(family: Family, data, sizes, skip) -> None:
    """The no-decode fast paths return exactly the general path's texts and states."""
    ids, prompt = data.draw(id_sequences(family)), data.draw(id_sequences(family))
    stops = data.draw(st.lists(st.sampled_from(["a", "😀", "中文", "\n\n", " the", "Hello w"]), max_size=2))
    params = SamplingParams(skip_special_tokens=skip, stop=stops, min_tokens=data.draw(st.integers(0, 5)), max_tokens=None)
    chunks = split(ids, sizes) + [[]]
    fast_state = general_state = initial_state(family.tokenizer, prompt, params)
    for n, chunk in enumerate(chunks):
        item = (chunk, n == len(chunks) - 1)
        (fast,) = detokenize_batch(family.tokenizer, [DetokItem(fast_state, *item)])
        with mock.patch("detok.batch.fast_result", return_value=None), mock.patch("detok.batch.fast_pieces_result", return_value=None):
            (general,) = detokenize_batch(family.tokenizer, [DetokItem(general_state, *item)])
        assert fast == general
        fast_state = general_state = fast.state
        if fast.stop is not None:
            break
