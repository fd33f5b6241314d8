"""`PromptLength`: refusing a text too long for the context without tokenizing all of it.

A 256 KiB prompt can hold tens of times the tokens of a 2,048-token context, and tokenizing
it whole before refusing it costs a worker about a fifth of a second. `PromptLength.check` proves a
text too long from a bounded prefix of the work, two ways:

- By bytes, before tokenizing: no token stands for more bytes of text than its own string
  has (byte-level tokens, SentencePiece pieces and byte fallbacks alike), so a text of B bytes
  has at least B / (the longest token's bytes) tokens. Only where that holds: a BPE tokenizer
  with no normalizer (one could shrink the text) and no unknown token that fuses a run of
  unknown characters.
- By pieces: a long text is tokenized a piece at a time, cut where whitespace follows other
  text (a pre-token boundary of byte-level BPE, where the pieces' tokens add up to the whole's), or at the
  piece's length where none does within `CUT_WINDOW` characters; the count stops as soon as
  the pieces' tokens, less `CUT_MARGIN` per piece, pass the limit.

A text that passes may still be too long: its own encoding then decides.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import tokenizers

PIECE_CHARS = 16_384
"""Characters tokenized at a time; a text no longer than this is left to its own encoding."""
CUT_WINDOW = 256
"""Characters searched past a piece's length for whitespace to cut at."""
CUT_MARGIN = 16
"""Tokens a cut may add to the pieces' count (an added token's text or a word cut in two)."""

_WHITESPACE_AFTER_TEXT = re.compile(r"\S(?=\s)")


class PromptTooLong(ValueError):
    """A text has more tokens than allowed; ``tokens`` is what was proved (a lower bound)."""

    def __init__(self, tokens: int, max_tokens: int) -> None:
        super().__init__(f"at least {tokens} tokens, over the limit of {max_tokens}")
        self.tokens = tokens
        self.max_tokens = max_tokens


@dataclass(frozen=True)
class PromptLength:
    tokenizer: tokenizers.Tokenizer
    max_token_bytes: int | None
    """The most bytes of text one token stands for; None where bytes prove nothing."""
    piece_chars: int = PIECE_CHARS

    @classmethod
    def of(cls, tokenizer: tokenizers.Tokenizer) -> PromptLength:
        return cls(tokenizer, _max_token_bytes(tokenizer))

    def check(self, text: str, max_tokens: int) -> None:
        """`PromptTooLong` when ``text`` surely has more than ``max_tokens`` tokens."""
        if self.max_token_bytes is not None:
            at_least = -(-len(text.encode("utf-8", "surrogatepass")) // self.max_token_bytes)
            if at_least > max_tokens:
                raise PromptTooLong(at_least, max_tokens)
        if len(text) > self.piece_chars:
            self._count_pieces(text, max_tokens)

    def _count_pieces(self, text: str, max_tokens: int) -> None:
        counted = 0
        for pieces, (start, end) in enumerate(self._pieces(text), start=1):  # a piece's count may hold what the cut at its end adds
            counted += len(self.tokenizer.encode(text[start:end], add_special_tokens=False))
            at_least = counted - pieces * CUT_MARGIN
            if at_least > max_tokens:
                raise PromptTooLong(at_least, max_tokens)

    def _pieces(self, text: str) -> Iterator[tuple[int, int]]:
        start = 0
        while len(text) - start > self.piece_chars:
            end = start + self.piece_chars
            found = _WHITESPACE_AFTER_TEXT.search(text, end - 1, end + CUT_WINDOW)
            cut = found.end() if found else end
            yield start, cut
            start = cut
        yield start, len(text)


def _max_token_bytes(tokenizer: tokenizers.Tokenizer) -> int | None:
    model = tokenizer.model
    if tokenizer.normalizer is not None or not isinstance(model, tokenizers.models.BPE):
        return None
    if model.fuse_unk and model.unk_token and not model.byte_fallback:
        return None
    return max(len(token.encode()) for token in tokenizer.get_vocab(with_added_tokens=True))
