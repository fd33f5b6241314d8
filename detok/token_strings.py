"""Token text and exact bytes for logprobs (OpenAI ``token`` and ``bytes``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from detok.vocab_bytes import VocabBytes


class TokenString(NamedTuple):
    """One token rendered alone: ``text`` is lossy (U+FFFD for a partial character), ``bytes`` exact."""

    text: str
    bytes: bytes


def token_strings(ids: Sequence[int], texts: Sequence[str], table: VocabBytes | None) -> list[TokenString]:
    """`TokenString` for each id, given ``texts[i] == tokenizer.decode([ids[i]], skip_special_tokens=False)``.

    With a byte-level ``table`` the bytes come from the vocab, so a token holding part of a
    character gets its real bytes; for other decoders they are the UTF-8 of the text.
    """
    if table is None:
        return [TokenString(text, text.encode("utf-8")) for text in texts]
    return [TokenString(text, table.bytes[i]) for i, text in zip(ids, texts)]
