"""Stop-string matching over streamed text, with the hold-back that makes it exact across calls.

A request's stop strings are found in one Aho-Corasick scan of the new text and the
stop tail (`DetokState.stop_tail`), so the cost is proportional to that text, not to text times stop strings.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import lru_cache

from detok.state import DetokParams


@dataclass(frozen=True, slots=True)
class StopMatch:
    """A stop string found in a buffer at ``[start, end)``."""

    stop: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class StopAutomaton:
    """Aho-Corasick automaton over a request's stop strings; state 0 is the root.

    goto: per state, the next state for each char that extends a stop's prefix.
    fail: per state, the state of its longest proper suffix that is a stop's prefix.
    output: per state, the longest stop string that ends it (None if none does).
    """

    goto: tuple[dict[str, int], ...]
    fail: tuple[int, ...]
    output: tuple[str | None, ...]
    max_len: int


@lru_cache(maxsize=1024)
def stop_automaton(stops: tuple[str, ...]) -> StopAutomaton:
    """Built once per distinct set of stop strings (a request's, kept while requests use it), in O(their length)."""
    goto: list[dict[str, int]] = [{}]
    output: list[str | None] = [None]
    for stop in stops:
        state = 0
        for char in stop:
            if char not in goto[state]:
                goto.append({})
                output.append(None)
                goto[state][char] = len(goto) - 1
            state = goto[state][char]
        output[state] = stop
    fail = [0] * len(goto)
    queue = deque(goto[0].values())  # the root's children fail to the root
    while queue:  # breadth first: a state's fail state and output are known before its children's
        state = queue.popleft()
        for char, child in goto[state].items():
            suffix = fail[state]
            while suffix and char not in goto[suffix]:
                suffix = fail[suffix]
            fail[child] = goto[suffix].get(char, 0)
            if output[child] is None:
                output[child] = output[fail[child]]
            queue.append(child)
    return StopAutomaton(tuple(goto), tuple(fail), tuple(output), max(map(len, stops), default=0))


def earliest_stop(buffer: str, stops: tuple[str, ...], min_end: int) -> StopMatch | None:
    """The stop string occurrence in ``buffer`` that completes first with ``end >= min_end``.

    Ties (same end) go to the longer string, which starts earlier. One scan of the chars
    from ``min_end - max(len(stop))`` on, whatever the number of stop strings.
    """
    if not stops:
        return None
    automaton = stop_automaton(stops)
    goto, fail, output = automaton.goto, automaton.fail, automaton.output
    state = 0
    for index in range(max(0, min_end - automaton.max_len), len(buffer)):
        char = buffer[index]
        while state and char not in goto[state]:
            state = fail[state]
        state = goto[state].get(char, 0)
        stop = output[state]
        if stop is not None and index + 1 >= min_end:
            return StopMatch(stop, index + 1 - len(stop), index + 1)
    return None


def split_tail(buffer: str, tail_len: int, params: DetokParams, final: bool) -> tuple[str, str]:
    """Text of ``buffer`` (the old stop tail, ``tail_len`` chars, then new text) to send now, and the next stop tail.

    The tail is withheld unless ``include_stop_str_in_output`` (then it was sent already);
    when ``final`` everything not sent yet goes.
    """
    keep = buffer[max(0, len(buffer) - params.stop_tail_len) :] if params.stop_tail_len and not final else ""
    if params.include_stop_str_in_output:
        return buffer[tail_len:], keep
    return buffer[: len(buffer) - len(keep)], keep


def stop_output(buffer: str, tail_len: int, match: StopMatch, include_stop: bool) -> str:
    """Text of ``buffer`` to send when ``match`` ends the request (the stop tail was sent if ``include_stop``)."""
    return buffer[tail_len : match.end] if include_stop else buffer[: match.start]
