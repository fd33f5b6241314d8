"""Priming from the prompt: right leading space, and no prompt text ever in the output."""

from __future__ import annotations

import pytest
from streaming import stream
from tokenizers import Tokenizer

from detok import initial_state
from sampling.params import SamplingParams


def test_first_token_keeps_its_leading_space(tokenizer: Tokenizer) -> None:
    prompt, ids = tokenizer.encode("Hello").ids, tokenizer.encode(" world again").ids
    result = stream(tokenizer, initial_state(tokenizer, prompt, SamplingParams()), [[i] for i in ids])
    assert result.deltas[0] == " world" and result.text == " world again"


@pytest.mark.parametrize("skip", [True, False])
def test_prompt_ending_inside_a_character_leaks_nothing(tokenizer: Tokenizer, skip: bool) -> None:
    """The prompt ends with the first bytes of 😀; the output starts with its last byte."""
    emoji = tokenizer.encode(" 😀").ids
    assert len(emoji) == 2  # 'ĠðŁĺ' then 'Ģ'
    prompt = tokenizer.encode("<|im_start|>user\nhi").ids + emoji[:1]
    ids = emoji[1:] + tokenizer.encode(" and more 中文").ids
    params = SamplingParams(skip_special_tokens=skip)
    for chunks in ([[i] for i in ids], [ids]):
        result = stream(tokenizer, initial_state(tokenizer, prompt, params), chunks)
        assert result.text == tokenizer.decode(ids, skip_special_tokens=skip)
        assert result.text.startswith("\ufffd and")  # the lone continuation byte, never "😀" or "hi"


def test_empty_prompt(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode(" leading space kept").ids
    result = stream(tokenizer, initial_state(tokenizer, [], SamplingParams()), [ids])
    assert result.text == " leading space kept"
