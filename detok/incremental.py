"""Exact incremental decoding of one request's window, as pure functions over decoded text.

A step appends new ids to the state's window and needs two decodes: the context ids
alone and the whole window (plus two more when the pending ids are rebased). Text after
the context is final except a trailing U+FFFD, which may still become a character, so
it is withheld until the next id arrives or the request finishes.

Exactness relies on the decoder being concatenative at character boundaries, which holds
for byte-level BPE (decode is lossy UTF-8 of the concatenated token bytes): the window
always starts at or before, and the context ends at, a point where decoding is in sync
with the full output's decode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from detok.state import CONTEXT_TOKENS, REPLACEMENT, DetokState

MAX_PENDING = 32
"""Pending ids beyond which the step looks for a sync point to drop older ones."""

REBASE_TAIL = 4
"""Ids left pending after a rebase; a split character spans at most four bytes."""


@dataclass(frozen=True, slots=True)
class Step:
    """A window with new ids appended, before decoding."""

    window: tuple[int, ...]
    ctx_len: int
    pending_sent: int
    rebase_at: int | None

    def sequences(self) -> list[list[int]]:
        """Id sequences to decode: context, window, and for a rebase both sides of the cut."""
        seqs = [list(self.window[: self.ctx_len]), list(self.window)]
        if self.rebase_at is not None:
            seqs += [list(self.window[: self.rebase_at]), list(self.window[self.rebase_at :])]
        return seqs


@dataclass(frozen=True, slots=True)
class Advance:
    """What decoding a step yields: new final text and the next window."""

    text: str
    window: tuple[int, ...]
    ctx_len: int
    pending_sent: int


def plan_step(state: DetokState, new_ids: Sequence[int]) -> Step:
    """Append ``new_ids`` to the state's window; ask for a rebase when too many are pending."""
    window = state.window + tuple(new_ids)
    pending = len(window) - state.ctx_len
    rebase_at = len(window) - REBASE_TAIL if pending > MAX_PENDING else None
    return Step(window, state.ctx_len, state.pending_sent, rebase_at)


def stable_end(context_chars: int, text: str, final: bool) -> int:
    """Length of the prefix of ``text`` that can no longer change.

    Only a U+FFFD after the context, at the very end, may still turn into a character.
    """
    if not final and len(text) > context_chars and text.endswith(REPLACEMENT):
        return len(text) - 1
    return len(text)


def finish_step(step: Step, texts: Sequence[str], final: bool) -> Advance:
    """Turn the decodes of ``step.sequences()`` into new text and the next window."""
    context_chars, text = len(texts[0]), texts[1]
    start = context_chars + step.pending_sent
    end = max(stable_end(context_chars, text, final), start)
    new_text = text[start:end]
    if end == len(text):
        window = step.window[-CONTEXT_TOKENS:]
        return Advance(new_text, window, len(window), 0)
    if step.rebase_at is not None and _in_sync(texts[2], texts[3], text):
        cut = step.rebase_at
        keep_from = max(0, cut - CONTEXT_TOKENS)
        return Advance(new_text, step.window[keep_from:], cut - keep_from, end - len(texts[2]))
    return Advance(new_text, step.window, step.ctx_len, end - context_chars)


def _in_sync(before: str, after: str, whole: str) -> bool:
    """Whether decoding restarts cleanly at the cut: the two halves concatenate to the whole.

    For lossy UTF-8 a cut inside an incomplete or merged sequence changes the number of
    U+FFFD, so equality (with text after the cut) means the cut is a sync point.
    """
    return bool(after) and len(before) + len(after) == len(whole) and before + after == whole
