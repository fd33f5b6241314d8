"""`tokenize_strings`: a request's bad words, DRY breakers and negative prompt as ids, only where they are used."""

from __future__ import annotations

import pytest
from sampling_helpers import char_encode

from sampling.params import SamplingParams, TokenIdOutOfVocabError
from sampling.tokenized import TokenizedStrings, has_strings, tokenize_strings

encode = char_encode(2**21)


def test_each_bad_word_as_given_and_after_a_space_deduplicated():
    strings = tokenize_strings(SamplingParams(bad_words=["ab", " ab", "c"]), encode)
    assert strings.bad_words == ((32, 32, 97, 98), (32, 97, 98), (32, 99), (97, 98), (99,))


def test_breakers_and_negative_prompt_only_when_used():
    off = SamplingParams(negative_prompt="neg")
    assert not has_strings(off) and tokenize_strings(off, encode) == TokenizedStrings()
    on = SamplingParams(dry_multiplier=0.5, dry_sequence_breakers=["ab", "b"], guidance_scale=2.0, negative_prompt="neg")
    assert has_strings(on)
    assert tokenize_strings(on, encode) == TokenizedStrings((), (97, 98), (110, 101, 103))
    assert not has_strings(on.model_copy(update={"dry_penalty_last_n": 0, "guidance_scale": 1.0}))


@pytest.mark.parametrize("field", ["bad_words", "dry_sequence_breakers", "negative_prompt"])
def test_ids_outside_the_vocabulary_name_the_field(field):
    params = SamplingParams(**{field: ["x"] if field != "negative_prompt" else "x"}, dry_multiplier=0.5, guidance_scale=2.0)
    strings = tokenize_strings(params, encode)
    strings.check_vocab(ord("x") + 1)
    with pytest.raises(TokenIdOutOfVocabError, match=field):
        strings.check_vocab(ord("x"))
