"""A text too long for the context is refused from a bounded prefix of the work, and never a text that fits."""

from __future__ import annotations

import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import DEFAULT_MODEL
from engine.loader.model_files import load_tokenizer
from engine.prompt_length import PromptLength, PromptTooLong

TOKENIZER = load_tokenizer(DEFAULT_MODEL)
LENGTH = PromptLength.of(TOKENIZER.tokenizer)
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
TEXT = st.lists(st.sampled_from(SPECIALS) | st.text(alphabet="ab \n\t.,1é🙂<|>", max_size=12), max_size=40).map("".join)


class CountingTokenizer:
    """The real tokenizer, counting the characters it is given."""

    def __init__(self) -> None:
        self.chars = 0

    def encode(self, text: str, add_special_tokens: bool = True) -> tokenizers.Encoding:
        self.chars += len(text)
        return TOKENIZER.tokenizer.encode(text, add_special_tokens=add_special_tokens)


class NoTokenizing:
    def encode(self, text: str, add_special_tokens: bool = True) -> tokenizers.Encoding:
        raise AssertionError("tokenized")


def _tokens(text: str) -> int:
    return len(TOKENIZER.tokenizer.encode(text, add_special_tokens=False))


def test_the_default_tokenizer_has_a_byte_bound_and_a_normalizing_one_has_none():
    assert LENGTH.max_token_bytes is not None and LENGTH.max_token_bytes >= max(len(t.encode()) for t in SPECIALS)
    normalizing = tokenizers.Tokenizer.from_str(TOKENIZER.tokenizer.to_str())
    normalizing.normalizer = tokenizers.normalizers.NFKC()
    assert PromptLength.of(normalizing).max_token_bytes is None


def test_bytes_alone_refuse_before_tokenizing():
    length = PromptLength(NoTokenizing(), max_token_bytes=4, piece_chars=10**9)  # type: ignore[arg-type]
    length.check("x" * 40, max_tokens=10)
    with pytest.raises(PromptTooLong) as refused:
        length.check("x" * 41, max_tokens=10)
    assert (refused.value.tokens, refused.value.max_tokens) == (11, 10)


def test_a_text_thirty_times_the_context_is_refused_after_about_one_context_of_tokenizing():
    counting = CountingTokenizer()
    text = "word " * 30_720
    with pytest.raises(PromptTooLong) as refused:
        PromptLength(counting, max_token_bytes=None).check(text, max_tokens=1023)  # type: ignore[arg-type]
    assert 1023 < refused.value.tokens <= _tokens(text)
    assert counting.chars < len(text) / 4


@settings(max_examples=300, deadline=None)
@given(TEXT, st.integers(1, 16))
def test_pieces_never_count_more_tokens_than_the_whole_has(text, piece_chars):
    PromptLength(TOKENIZER.tokenizer, max_token_bytes=None, piece_chars=piece_chars).check(text, max_tokens=_tokens(text))


@settings(max_examples=100, deadline=None)
@given(TEXT)
def test_bytes_never_prove_more_tokens_than_the_whole_has(text):
    LENGTH.check(text, max_tokens=_tokens(text))


@settings(max_examples=100, deadline=None)
@given(TEXT)
def test_encoding_within_a_limit_is_exact_at_it_and_refused_below_it(text):
    ids = TOKENIZER.encode(text)
    assert TOKENIZER.encode(text, max_tokens=len(ids)) == ids
    with pytest.raises(PromptTooLong):
        TOKENIZER.encode(text, max_tokens=len(ids) - 1)
