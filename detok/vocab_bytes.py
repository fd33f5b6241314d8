"""Per-tokenizer table of each id's bytes under the byte-level decoder, for the fast path.

A ``tokenizers`` ByteLevel decoder turns every token into bytes (``token_bytes``) and the
output is lossy UTF-8 of their concatenation, with special tokens left out when
``skip_special_tokens``. So when the concatenated bytes are *valid* UTF-8, their strict
decode is exactly what ``Tokenizer.decode`` returns, with no tokenizer call (`detok.fast`).
The table is built once per tokenizer (``vocab_size`` calls to ``id_to_token``, tens of
milliseconds) and cached weakly; the tokenizer must not gain tokens afterwards.
"""

from __future__ import annotations

import weakref
from functools import cache

from tokenizers import Tokenizer, decoders


@cache
def _byte_level_chars() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable char that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {chr(b): b for b in printable}
    extra = (b for b in range(256) if b not in set(printable))
    chars.update({chr(256 + n): b for n, b in enumerate(extra)})
    return chars


def token_bytes(token: str) -> bytes:
    """Bytes of a vocab entry as the ByteLevel decoder maps it.

    Like the decoder, a token with any char outside the byte-level alphabet is taken as UTF-8 text.
    """
    table = _byte_level_chars()
    try:
        return bytes(table[c] for c in token)
    except KeyError:
        return token.encode("utf-8")


class VocabBytes:
    """Bytes of every id, and the ids that ``skip_special_tokens`` leaves out."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.bytes: list[bytes] = [token_bytes(tokenizer.id_to_token(i) or "") for i in range(size)]
        special = {i for i, tok in tokenizer.get_added_tokens_decoder().items() if tok.special}
        self.skipped: list[bytes] = [b"" if i in special else b for i, b in enumerate(self.bytes)]


_CACHE: weakref.WeakKeyDictionary[Tokenizer, VocabBytes] = weakref.WeakKeyDictionary()


def vocab_bytes(tokenizer: Tokenizer) -> VocabBytes | None:
    """The cached table for a tokenizer with a ByteLevel decoder, else ``None``."""
    if not isinstance(tokenizer.decoder, decoders.ByteLevel):
        return None
    table = _CACHE.get(tokenizer)
    if table is None:
        table = _CACHE[tokenizer] = VocabBytes(tokenizer)
    return table
