"""Stop-string matching over streamed text, with the hold-back that makes it exact across calls."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StopMatch:
    """A stop string found in a buffer at ``[start, end)``."""

    stop: str
    start: int
    end: int


def earliest_stop(buffer: str, stops: Sequence[str], min_end: int) -> StopMatch | None:
    """The stop string occurrence in ``buffer`` that completes first with ``end >= min_end``.

    Ties (same end) go to the longer string, which starts earlier.
    """
    best: StopMatch | None = None
    for stop in stops:
        start = buffer.find(stop, max(0, min_end - len(stop)))
        if start < 0:
            continue
        match = StopMatch(stop, start, start + len(stop))
        if best is None or (match.end, match.start) < (best.end, best.start):
            best = match
    return best


def split_held(buffer: str, holdback: int, final: bool) -> tuple[str, str]:
    """Split ``buffer`` into text to send now and the last ``holdback`` chars to keep back.

    Everything is sent when ``final``.
    """
    if final or holdback == 0:
        return buffer, ""
    cut = max(0, len(buffer) - holdback)
    return buffer[:cut], buffer[cut:]


def stop_output(buffer: str, match: StopMatch, include_stop: bool) -> str:
    """Text of ``buffer`` to send when ``match`` ends the request."""
    return buffer[: match.end if include_stop else match.start]
