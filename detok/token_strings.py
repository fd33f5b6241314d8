"""Token text and exact bytes for logprobs (OpenAI ``token`` and ``bytes``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from detok.pieces import Pieces
from detok.vocab_bytes import VocabBytes


class TokenString(NamedTuple):
    """One token rendered as it reads inside text: ``text`` is lossy (U+FFFD for a partial
    character) and keeps its leading space (``▁true`` is " true"), ``bytes`` are exact."""

    text: str
    bytes: bytes


def token_strings(ids: Sequence[int], texts: Sequence[str], table: VocabBytes | None, pieces: Pieces | None) -> list[TokenString]:
    """`TokenString` for each id, given each ``texts[i] == tokenizer.decode([*anchor, ids[i]], skip_special_tokens=False)``.

    The anchor (`detok.pieces`; none for a byte-level ``table``) makes text keep the leading
    space that a decode drops from its first token. The bytes come from the vocab for a
    byte-level or byte-fallback token, so a token holding part of a character gets its real
    bytes; else they are the UTF-8 of the text.
    """
    if table is not None:
        return [TokenString(text, table.bytes[i]) for i, text in zip(ids, texts)]
    assert pieces is not None
    strings = []
    for i, text in zip(ids, texts):
        text = text[pieces.anchor_chars :]
        byte = pieces.byte_of_id.get(i)
        strings.append(TokenString(text, text.encode("utf-8") if byte is None else bytes([byte])))
    return strings
