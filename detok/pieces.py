"""How a tokenizer without a byte-level decoder renders ids: pieces after an anchor token.

The other decoders the loaders accept (SentencePiece style: ``Metaspace``, or ``Replace``,
``ByteFallback``, ``Fuse``, ``Strip``) render each token as its own piece, with two
exceptions. A run of consecutive byte-fallback tokens (``<0xE4>``) is one piece: its bytes
as UTF-8 if they are valid, else one U+FFFD per byte, so a later byte can still turn a whole
run of complete characters into U+FFFD. And the first piece of a decode loses its leading
space. Hence the text that ids add after any text that does not end inside a byte run is
``decode(anchor + ids)`` less ``decode(anchor)``, where the anchor is one ordinary token:
the context of every such request is that anchor, never prompt ids, which could end inside
a run (their bytes would merge with the output's) or render no text at all.

Text is final up to the start of the trailing byte run, which is held until a non-byte token
ends it or the request finishes. For these decoders each other id's text after the anchor is
tabled once per tokenizer (``piece_of_id``), so most steps need no tokenizer call
(`detok.fast`). Any other decoder is handled as vLLM does: text that ends in U+FFFD is held.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from tokenizers import Tokenizer, decoders

REPLACEMENT = "\ufffd"

BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class FinalSplit(NamedTuple):
    """Where a window's decoded text stops being final (`Pieces.split_final`)."""

    final_chars: int
    """How many chars of the text later ids cannot change."""
    pending_at: int
    """The index of the first id whose text still may (the window's length if none)."""


@dataclass(frozen=True)
class Pieces:
    """A tokenizer's anchor and byte-fallback ids (`pieces_of` builds it once per tokenizer)."""

    anchor: tuple[int, ...]
    """One ordinary token whose text is not empty."""
    anchor_chars: int
    """Length of ``decode(anchor)``."""
    byte_of_id: Mapping[int, int]
    """Each byte-fallback id and its byte; empty when the decoder has no byte fallback."""
    special_ids: frozenset[int]
    """Ids that ``skip_special_tokens`` leaves out (before the decoder, so a byte run goes on across them)."""
    piece_of_id: tuple[str | None, ...] | None
    """Each id's text after the anchor (``None`` for byte ids); ``None`` for a decoder not known to render pieces."""
    skipped_piece_of_id: tuple[str | None, ...] | None
    """The same with ``""`` for the ids that ``skip_special_tokens`` leaves out."""

    def renders_text(self, ids: Sequence[int], skip_special_tokens: bool) -> bool:
        """Whether ``ids`` have a piece: then text after them keeps its leading space."""
        return any(not (skip_special_tokens and i in self.special_ids) for i in reversed(ids))

    def split_final(self, ids: Sequence[int], text: str, ctx_len: int, ctx_chars: int, skip_special_tokens: bool) -> FinalSplit:
        """Where ``text == decode(ids)`` (ids: a window) stops being final."""
        if self.byte_of_id:
            run_at = self._open_run(ids, skip_special_tokens)
            return FinalSplit(len(text) - self._run_chars(ids[run_at:]) if run_at < len(ids) else len(text), run_at)
        if self.piece_of_id is None and len(text) > ctx_chars and text[-1] == REPLACEMENT:
            return FinalSplit(ctx_chars, ctx_len)
        return FinalSplit(len(text), len(ids))

    def _open_run(self, ids: Sequence[int], skip_special_tokens: bool) -> int:
        """Where the byte run that ends ``ids`` (and may go on) starts; ``len(ids)`` if none does."""
        start, has_bytes = len(ids), False
        for n in range(len(ids) - 1, -1, -1):
            if ids[n] in self.byte_of_id:
                start, has_bytes = n, True
            elif not (skip_special_tokens and ids[n] in self.special_ids):
                break
        return start if has_bytes else len(ids)

    def _run_chars(self, run: Sequence[int]) -> int:
        """Length of the piece of a byte run (skipped special ids in it count for nothing)."""
        data = bytes(self.byte_of_id[i] for i in run if i in self.byte_of_id)
        try:
            return len(data.decode("utf-8"))
        except UnicodeDecodeError:
            return len(data)


_CACHE: weakref.WeakKeyDictionary[Tokenizer, Pieces] = weakref.WeakKeyDictionary()


def pieces_of(tokenizer: Tokenizer) -> Pieces | None:
    """The cached `Pieces` of a tokenizer, or ``None`` for a byte-level decoder (see `detok.vocab_bytes`)."""
    if isinstance(tokenizer.decoder, decoders.ByteLevel):
        return None
    pieces = _CACHE.get(tokenizer)
    if pieces is None:
        pieces = _CACHE[tokenizer] = _build(tokenizer)
    return pieces


def _build(tokenizer: Tokenizer) -> Pieces:
    special = frozenset(i for i, token in tokenizer.get_added_tokens_decoder().items() if token.special)
    byte_ids = {i: int(match[1], 16) for token, i in tokenizer.get_vocab(with_added_tokens=True).items() if (match := BYTE_TOKEN.fullmatch(token))}
    anchor = _anchor(tokenizer, special | byte_ids.keys())
    anchor_text = tokenizer.decode(list(anchor), skip_special_tokens=False)
    if not _falls_back_to_bytes(tokenizer, anchor, anchor_text, {b: i for i, b in byte_ids.items()}):
        byte_ids = {}
    if not _renders_pieces(tokenizer.decoder):
        return Pieces(anchor, len(anchor_text), byte_ids, special, None, None)
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    texts = tokenizer.decode_batch([[*anchor, i] for i in range(size)], skip_special_tokens=False)
    pieces = tuple(None if i in byte_ids else text[len(anchor_text) :] for i, text in enumerate(texts))
    skipped = tuple("" if i in special else piece for i, piece in enumerate(pieces))
    return Pieces(anchor, len(anchor_text), byte_ids, special, pieces, skipped)


def _renders_pieces(decoder: decoders.Decoder | None) -> bool:
    """Whether a decoder is one this module describes: ``Metaspace``, or a ``Sequence`` of ``Replace("▁", " ")``,
    ``ByteFallback``, ``Fuse`` and, after ``Fuse``, ``Strip(" ", 0 or 1, 0)``."""
    try:
        spec = json.loads(decoder.__getstate__())
    except Exception:  # noqa: BLE001 - None, or a custom Python decoder: not one of these
        return False
    if spec["type"] == "Metaspace":
        return True
    if spec["type"] != "Sequence":
        return False
    fused = False
    for step in spec["decoders"]:
        if step["type"] == "Fuse":
            fused = True
        elif step["type"] == "Strip":
            if not (fused and step["content"] == " " and step["start"] <= 1 and step["stop"] == 0):
                return False
        elif step != {"type": "Replace", "pattern": {"String": "▁"}, "content": " "} and step["type"] != "ByteFallback":
            return False
    return True


def _anchor(tokenizer: Tokenizer, excluded: set[int] | frozenset[int]) -> tuple[int, ...]:
    """The first id that is neither special nor a byte and renders whole characters."""
    for i in range(tokenizer.get_vocab_size(with_added_tokens=True)):
        if i not in excluded:
            text = tokenizer.decode([i], skip_special_tokens=False)
            if text and REPLACEMENT not in text:
                return (i,)
    raise ValueError("the tokenizer has no ordinary token that renders text")


def _falls_back_to_bytes(tokenizer: Tokenizer, anchor: tuple[int, ...], anchor_text: str, id_of_byte: dict[int, int]) -> bool:
    """Whether ``<0x..>`` tokens render as bytes, a run at a time: ``<0x41>`` is "A" and ``<0xE4><0x41>`` two U+FFFD."""
    if 0x41 not in id_of_byte or 0xE4 not in id_of_byte:
        return False
    letter, lead = id_of_byte[0x41], id_of_byte[0xE4]

    def after_anchor(ids: list[int]) -> str:
        return tokenizer.decode([*anchor, *ids], skip_special_tokens=False)[len(anchor_text) :]

    return after_anchor([letter]) == "A" and after_anchor([lead, letter]) == REPLACEMENT * 2
