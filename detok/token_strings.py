"""Token text and exact bytes for logprobs (OpenAI ``token`` and ``bytes``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from tokenizers import Tokenizer, decoders


@dataclass(frozen=True, slots=True)
class TokenString:
    """One token rendered alone: ``text`` is lossy (U+FFFD for a partial character), ``bytes`` exact."""

    text: str
    bytes: bytes


@cache
def _byte_level_chars() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable char that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {chr(b): b for b in printable}
    extra = (b for b in range(256) if b not in set(printable))
    chars.update({chr(256 + n): b for n, b in enumerate(extra)})
    return chars


def token_bytes(token: str) -> bytes:
    """Bytes of a byte-level vocab entry, as the ByteLevel decoder maps it.

    Like the decoder, a token with any char outside the alphabet is taken as UTF-8 text.
    """
    table = _byte_level_chars()
    try:
        return bytes(table[c] for c in token)
    except KeyError:
        return token.encode("utf-8")


def token_strings(tokenizer: Tokenizer, ids: Sequence[int], texts: Sequence[str]) -> list[TokenString]:
    """`TokenString` for each id, given ``texts[i] == tokenizer.decode([ids[i]], skip_special_tokens=False)``.

    Bytes come from the byte-level vocab, so a token holding part of a character gets its
    real bytes; for other decoders they are the UTF-8 of the text.
    """
    if not isinstance(tokenizer.decoder, decoders.ByteLevel):
        return [TokenString(text, text.encode("utf-8")) for text in texts]
    return [TokenString(text, token_bytes(tokenizer.id_to_token(i))) for i, text in zip(ids, texts)]
