"""Where a reasoning model's answer begins in its output text, found as the text streams.

The serving layer's reasoning parser splits a choice's text into its thinking and its answer; stop
strings and ``max_tokens`` apply to the answer alone, so the detokenizer, which finds stop strings
and cuts the output, must know where the answer begins, exactly and whatever the split of the
output into calls. `ThinkingTags` says how the thinking is delimited; `scan` reads the text a piece
at a time, carrying an `AnswerProgress` (a small tuple in `detok.state.DetokState`).

The rules are those of the ``<think>…</think>`` parsers: the output opens a thinking when it starts
with ``open`` (or always, with ``starts_open``); a thinking ends at the first ``close``; an output that
does not open one is all answer. While the first characters could still be ``open``, the output is
undecided: that text is held back (it may be answer text, where a stop string can match).
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple


class ThinkingTags(NamedTuple):
    """How a thinking is delimited in the output text."""

    open: str
    close: str
    starts_open: bool
    """The output starts in a thinking even without ``open`` (the chat template opened it)."""


class AnswerRules(NamedTuple):
    """A request's fixed rules for its answer: where it begins, and how many tokens it may have."""

    tags: ThinkingTags
    max_tokens: int | None
    """Answer tokens at most (the tokens after the one that completes ``close``; all of them when
    the output opens no thinking); ``None``: no limit but the engine's."""


class Phase(IntEnum):
    UNDECIDED = 0
    """The output's first characters could still be ``open``: held back."""
    THINKING = 1
    ANSWER = 2


class AnswerProgress(NamedTuple):
    """Where one output stands: its phase; ``seen``, the undecided text (UNDECIDED) or the thinking's
    last ``len(close) - 1`` characters, which a ``close`` split across calls starts with (THINKING);
    ``answer_from``, the output tokens before the answer's first (ANSWER)."""

    phase: Phase
    seen: str
    answer_from: int


class Scan(NamedTuple):
    """One piece of text read: the next progress, the text outside the answer to send now, and the
    answer's text when the answer began in this piece (``None``: not yet), at the output's start or not."""

    progress: AnswerProgress
    outside: str
    answer: str | None
    from_start: bool = False


def initial_progress(tags: ThinkingTags) -> AnswerProgress:
    return AnswerProgress(Phase.THINKING if tags.starts_open else Phase.UNDECIDED, "", 0)


def scan(progress: AnswerProgress, tags: ThinkingTags, text: str, finished: bool) -> Scan:
    """Read ``text``, the output's next characters, in a phase other than ANSWER."""
    unsent = text
    if progress.phase is Phase.UNDECIDED:
        pending = progress.seen + text
        if tags.open.startswith(pending) and pending != tags.open and not finished:
            return Scan(progress._replace(seen=pending), "", None)
        if not pending.startswith(tags.open):
            return Scan(AnswerProgress(Phase.ANSWER, "", 0), "", pending, from_start=True)
        progress, unsent = AnswerProgress(Phase.THINKING, "", 0), pending  # ``open`` cannot overlap ``close``
    pending = progress.seen + unsent
    end = pending.find(tags.close)
    if end < 0:
        memory = len(tags.close) - 1
        return Scan(progress._replace(seen=pending[max(0, len(pending) - memory) :] if memory else ""), unsent, None)
    cut = end + len(tags.close) - len(progress.seen)
    return Scan(AnswerProgress(Phase.ANSWER, "", 0), unsent[:cut], unsent[cut:])
