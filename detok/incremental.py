"""Exact incremental decoding of one request's window, as pure functions over decoded text.

A step appends new ids to the state's window and decodes it, plus the context alone when
its text length is not known. Text after the context that may still change is withheld until
more ids arrive or the request finishes; the ids whose text is final become the next context.

Byte-level BPE (``pieces`` is ``None``): decode is lossy UTF-8 of the concatenated token
bytes, so only a last U+FFFD (an incomplete character) may change, and decode is
*concatenative* at any point where the text so far ends in a complete character: the next
context's text length is known without decoding it again. Too many pending ids (only
undecodable output does that) are cut at a verified sync point (`rebase_point`), which keeps
the window bounded.

Other decoders (`detok.pieces`): the context is the tokenizer's anchor token, text is final
up to the byte run that may still go on, and that run's ids stay pending.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from detok.pieces import REPLACEMENT, Pieces
from detok.state import CONTEXT_TOKENS, DetokState

MAX_PENDING = 32
"""Pending ids beyond which a byte-level step looks for a sync point to drop older ones."""

REBASE_TAIL = 4
"""Ids left pending by a rebase; a split character spans at most four bytes."""


class Advance(NamedTuple):
    """A request's decoding after a step: the text newly final, and the state's next decoding fields."""

    new_text: str
    window: tuple[int, ...]
    ctx_len: int
    ctx_chars: int | None
    pending_sent: int


def rebase_point(state: DetokState, window: tuple[int, ...], pieces: Pieces | None) -> int | None:
    """Where to try cutting off old pending ids of a byte-level window, when too many are pending."""
    if pieces is None and len(window) - state.ctx_len > MAX_PENDING:
        return len(window) - REBASE_TAIL
    return None


def window_sequences(state: DetokState, window: tuple[int, ...], rebase_at: int | None) -> list[tuple[int, ...]]:
    """Id sequences to decode: the window, the context if its length is unknown, both sides of a rebase cut."""
    seqs = [window]
    if state.ctx_chars is None:
        seqs.append(window[: state.ctx_len])
    if rebase_at is not None:
        seqs += [window[:rebase_at], window[rebase_at:]]
    return seqs


def context_chars(state: DetokState, texts: Sequence[str]) -> int:
    """Length of the context's text, given the decodes of `window_sequences`."""
    return len(texts[1]) if state.ctx_chars is None else state.ctx_chars


def final_chars(state: DetokState, ctx_chars: int, ids: Sequence[int], text: str, pieces: Pieces | None) -> int:
    """Length of the prefix of ``text == decode(ids)`` (ids: a window) that later ids cannot change."""
    if pieces is not None:
        return pieces.split_final(ids, text, state.ctx_len, ctx_chars, state.params.skip_special_tokens).final_chars
    return len(text) - 1 if len(text) > ctx_chars and text[-1] == REPLACEMENT else len(text)


def advance(
    state: DetokState,
    window: tuple[int, ...],
    rebase_at: int | None,
    texts: Sequence[str],
    final: bool,
    pieces: Pieces | None,
) -> Advance:
    """Turn the decodes of `window_sequences` into newly final text and the next window."""
    text = texts[0]
    ctx_chars = context_chars(state, texts)
    if pieces is not None:
        return _advance_pieces(state, window, text, ctx_chars, final, pieces)
    start = ctx_chars + state.pending_sent
    end = len(text) if final else max(final_chars(state, ctx_chars, window, text, None), start)
    if end == len(text):
        return _settle(state, window, text[start:], len(text) - ctx_chars, ctx_chars)
    if rebase_at is not None and _in_sync(texts[-2], texts[-1], text):
        keep_from = max(0, rebase_at - CONTEXT_TOKENS)
        return Advance(text[start:end], window[keep_from:], rebase_at - keep_from, None, end - len(texts[-2]))
    return Advance(text[start:end], window, state.ctx_len, ctx_chars, end - ctx_chars)


def _settle(state: DetokState, window: tuple[int, ...], new_text: str, pending_chars: int, ctx_chars: int) -> Advance:
    """All byte-level text is final: the pending ids (or, if many, the last few) become the context."""
    pending = window[state.ctx_len :]
    if not pending:
        return Advance(new_text, window, state.ctx_len, ctx_chars, 0)
    if len(pending) <= CONTEXT_TOKENS:
        return Advance(new_text, pending, len(pending), pending_chars, 0)
    context = window[-CONTEXT_TOKENS:]
    return Advance(new_text, context, len(context), None, 0)


def _advance_pieces(state: DetokState, window: tuple[int, ...], text: str, ctx_chars: int, final: bool, pieces: Pieces) -> Advance:
    """The ids whose text is final are done; the rest (an open byte run) stay pending after the anchor.

    Nothing is ever sent of the pending text before it is done, so ``pending_sent`` stays 0.
    """
    skip = state.params.skip_special_tokens
    end, pending_at = (len(text), len(window)) if final else pieces.split_final(window, text, state.ctx_len, ctx_chars, skip)
    if pending_at <= state.ctx_len:
        return Advance("", window, state.ctx_len, ctx_chars, 0)
    context = pieces.anchor if state.ctx_len or pieces.renders_text(window[state.ctx_len : pending_at], skip) else ()
    new_text = text[ctx_chars : max(end, ctx_chars)]
    return Advance(new_text, context + window[pending_at:], len(context), pieces.anchor_chars if context else 0, 0)


def _in_sync(before: str, after: str, whole: str) -> bool:
    """Whether decoding restarts cleanly at the cut: the two halves concatenate to the whole.

    For lossy UTF-8 a cut inside an incomplete or merged sequence changes the number of
    U+FFFD, so equality (with text after the cut) means the cut is a sync point.
    """
    return bool(after) and len(before) + len(after) == len(whole) and before + after == whole
