"""Exact incremental decoding of one request's window, as pure functions over decoded text.

A step appends new ids to the state's window and decodes it, plus the context alone when
its text length is not known. Text after the context is final unless it ends in U+FFFD,
which may still become a character (see `stable_end`), so that is withheld until more ids
arrive or the request finishes. When the pending text is final its ids become the next
context. Too many pending ids (only undecodable output does that) are cut at a verified
sync point (`rebase_point`), which keeps the window bounded for byte-level BPE.

Exactness needs windows to start and contexts to end where decoding is in sync with the
decode of the whole output. For byte-level BPE (decode is lossy UTF-8 of the concatenated
token bytes) any point where the text so far ends in a complete character is such a point,
and there decode is *concatenative*: the next context's text length is known without
decoding it again. Other decoders are handled like vLLM: the context is re-decoded every
step, and all pending text is withheld while it ends in U+FFFD.
"""

from __future__ import annotations

from collections.abc import Sequence

from detok.state import CONTEXT_TOKENS, REPLACEMENT, DetokState

MAX_PENDING = 32
"""Pending ids beyond which a step looks for a sync point to drop older ones."""

REBASE_TAIL = 4
"""Ids left pending by a rebase; a split character spans at most four bytes."""

Advance = tuple[str, tuple[int, ...], int, "int | None", int]
"""``(newly final text, window, ctx_len, ctx_chars, pending_sent)`` after a step."""


def rebase_point(state: DetokState, window: tuple[int, ...], concatenative: bool) -> int | None:
    """Where to try cutting off old pending ids, when too many are pending.

    Only for concatenative decoders: elsewhere (byte fallback) halves that concatenate to
    the whole do not prove a sync point, so, as in vLLM, the window grows while the text
    ends in U+FFFD.
    """
    if concatenative and len(window) - state.ctx_len > MAX_PENDING:
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


def stable_end(ctx_chars: int, text: str, final: bool, concatenative: bool) -> int:
    """Length of the prefix of ``text`` that can no longer change.

    Text after the context ending in U+FFFD may still change: for lossy UTF-8 only that last
    U+FFFD (an incomplete character is one U+FFFD); for other decoders, such as byte
    fallback (one U+FFFD per byte until the character completes), all of it, as in vLLM.
    """
    if not final and len(text) > ctx_chars and text[-1] == REPLACEMENT:
        return len(text) - 1 if concatenative else ctx_chars
    return len(text)


def advance(
    state: DetokState,
    window: tuple[int, ...],
    rebase_at: int | None,
    texts: Sequence[str],
    final: bool,
    concatenative: bool,
) -> Advance:
    """Turn the decodes of `window_sequences` into newly final text and the next window."""
    text = texts[0]
    ctx_chars = context_chars(state, texts)
    start = ctx_chars + state.pending_sent
    end = max(stable_end(ctx_chars, text, final, concatenative), start)
    if end == len(text):
        return _settle(state, window, text[start:], len(text) - ctx_chars, ctx_chars, concatenative)
    if rebase_at is not None and _in_sync(texts[-2], texts[-1], text):
        keep_from = max(0, rebase_at - CONTEXT_TOKENS)
        return text[start:end], window[keep_from:], rebase_at - keep_from, None, end - len(texts[-2])
    return text[start:end], window, state.ctx_len, ctx_chars, end - ctx_chars


def _settle(state: DetokState, window: tuple[int, ...], new_text: str, pending_chars: int, ctx_chars: int, concatenative: bool) -> Advance:
    """All text is final: the pending ids (or, if many, the last few) become the context."""
    pending = window[state.ctx_len :]
    if not pending:
        return new_text, window, state.ctx_len, ctx_chars, 0
    if concatenative and len(pending) <= CONTEXT_TOKENS:
        return new_text, pending, len(pending), pending_chars, 0
    context = window[-CONTEXT_TOKENS:]
    return new_text, context, len(context), None, 0


def _in_sync(before: str, after: str, whole: str) -> bool:
    """Whether decoding restarts cleanly at the cut: the two halves concatenate to the whole.

    For lossy UTF-8 a cut inside an incomplete or merged sequence changes the number of
    U+FFFD, so equality (with text after the cut) means the cut is a sync point.
    """
    return bool(after) and len(before) + len(after) == len(whole) and before + after == whole
