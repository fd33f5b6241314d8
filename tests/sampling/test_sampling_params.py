"""SamplingParams validation: every invalid value is a clear error naming the field."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from sampling.params import (
    LOGIT_BIAS_LIMIT,
    MAX_BAD_WORD_CHARS,
    MAX_BAD_WORDS,
    MAX_DRY_BREAKER_CHARS,
    MAX_DRY_SEQUENCE_BREAKERS,
    SamplingParams,
    TokenIdOutOfVocabError,
)

INVALID = [
    ("n", 0), ("n", 129), ("temperature", -0.1), ("temperature", math.nan), ("temperature", math.inf),
    ("top_p", 0.0), ("top_p", 1.01), ("top_p", math.nan), ("top_k", -2), ("min_p", -0.1), ("min_p", 1.5),
    ("typical_p", 0.0), ("typical_p", 2.0), ("top_n_sigma", math.nan), ("presence_penalty", 2.5),
    ("frequency_penalty", -2.5), ("repetition_penalty", 0.0), ("repetition_penalty", math.inf),
    ("dry_multiplier", -1.0), ("dry_base", 0.5), ("dry_allowed_length", -1), ("dry_penalty_last_n", -2),
    ("dry_sequence_breakers", [""]), ("xtc_threshold", 1.5), ("xtc_probability", -0.1), ("seed", 2**64),
    ("seed", -(2**63) - 1), ("stop", [""]), ("stop", ""), ("max_tokens", -1), ("min_tokens", -1),
    ("logprobs", 21), ("logprobs", -1), ("prompt_logprobs", 21), ("logit_bias", {1: math.nan}),
    ("logit_bias", {"x": 1.0}), ("allowed_token_ids", []), ("bad_words", [""]), ("temperature", "hot"),
    ("top_k", 1.5), ("stop_token_ids", ["a"]),
]  # fmt: skip


@pytest.mark.parametrize(("field", "value"), INVALID)
def test_invalid_value_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ValidationError) as info:
        SamplingParams(**{field: value})
    assert any(field in map(str, error["loc"]) for error in info.value.errors())


def test_unknown_field_rejected() -> None:
    with pytest.raises(ValidationError, match="best_of"):
        SamplingParams(best_of=2)


def test_min_tokens_above_max_tokens() -> None:
    with pytest.raises(ValidationError, match="min_tokens"):
        SamplingParams(min_tokens=5, max_tokens=4)
    assert SamplingParams(min_tokens=5, max_tokens=None).min_tokens == 5


def test_frozen() -> None:
    with pytest.raises(ValidationError):
        SamplingParams().temperature = 0.5  # type: ignore[misc]


def test_stop_string_becomes_list_and_defaults() -> None:
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(stop=None).stop == []
    p = SamplingParams()
    assert not p.is_greedy and SamplingParams(temperature=0).is_greedy


@pytest.mark.parametrize(
    ("field", "value"),
    [("stop_token_ids", [5, 100]), ("logit_bias", {100: 1.0}), ("allowed_token_ids", [-1]), ("logit_bias", {-3: 1.0})],
)
def test_check_vocab_names_the_field(field: str, value: object) -> None:
    params = SamplingParams(**{field: value})
    with pytest.raises(TokenIdOutOfVocabError, match=field):
        params.check_vocab(100)


@given(st.floats(allow_nan=True, allow_infinity=True))
@settings(max_examples=200, deadline=None)
def test_temperature_any_float(value: float) -> None:
    if math.isfinite(value) and value >= 0:
        assert SamplingParams(temperature=value).temperature == value
    else:
        with pytest.raises(ValidationError, match="temperature"):
            SamplingParams(temperature=value)


@given(st.floats(allow_nan=True, allow_infinity=True))
@settings(max_examples=200, deadline=None)
def test_top_p_any_float(value: float) -> None:
    if 0 < value <= 1:
        assert SamplingParams(top_p=value).top_p == value
    else:
        with pytest.raises(ValidationError, match="top_p"):
            SamplingParams(top_p=value)


@given(st.dictionaries(st.integers(0, 1000), st.floats(allow_nan=False, allow_infinity=False), max_size=5))
@settings(max_examples=200, deadline=None)
def test_logit_bias_is_clamped(bias: dict[int, float]) -> None:
    clamped = SamplingParams(logit_bias=bias).logit_bias
    assert clamped.keys() == bias.keys()
    for token, value in bias.items():
        assert clamped[token] == max(-LOGIT_BIAS_LIMIT, min(LOGIT_BIAS_LIMIT, value))


@given(st.integers(), st.integers(1, 10**6))
@settings(max_examples=200, deadline=None)
def test_token_ids_against_vocab(token: int, vocab: int) -> None:
    params = SamplingParams(stop_token_ids=[token])
    if 0 <= token < vocab:
        params.check_vocab(vocab)
    else:
        with pytest.raises(TokenIdOutOfVocabError, match="stop_token_ids"):
            params.check_vocab(vocab)


@given(st.integers())
@settings(max_examples=200, deadline=None)
def test_seed_range(seed: int) -> None:
    if -(2**63) <= seed < 2**64:
        assert SamplingParams(seed=seed).seed == seed
    else:
        with pytest.raises(ValidationError, match="seed"):
            SamplingParams(seed=seed)


@given(st.lists(st.text(max_size=3), max_size=4))
@settings(max_examples=100, deadline=None)
def test_bad_words_any_strings(words: list[str]) -> None:
    if all(words):
        assert SamplingParams(bad_words=words).bad_words == words
    else:
        with pytest.raises(ValidationError, match="bad_words"):
            SamplingParams(bad_words=words)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dry_sequence_breakers", ["x"] * (MAX_DRY_SEQUENCE_BREAKERS + 1)),
        ("dry_sequence_breakers", ["x" * (MAX_DRY_BREAKER_CHARS + 1)]),
        ("bad_words", ["x"] * (MAX_BAD_WORDS + 1)),
        ("bad_words", ["x" * (MAX_BAD_WORD_CHARS + 1)]),
    ],
)
def test_sampler_limits_name_the_field(field: str, value: list[str]) -> None:
    with pytest.raises(ValidationError) as info:
        SamplingParams(**{field: value})
    assert [error["loc"] for error in info.value.errors()] == [(field,)]
    SamplingParams(**{field: value[:-1] if len(value) > 1 else [value[0][:-1]]})
