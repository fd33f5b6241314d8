"""`earliest_stop`'s one-scan search gives exactly what one ``find`` per stop string gives."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from detok.stop import StopMatch, earliest_stop


def naive_earliest_stop(buffer: str, stops: tuple[str, ...], min_end: int) -> StopMatch | None:
    """The reference: each stop's first occurrence ending at or after ``min_end``; earliest end, then earliest start."""
    best = None
    for stop in stops:
        start = buffer.find(stop, max(0, min_end - len(stop)))
        if start >= 0 and (best is None or (start + len(stop), start) < (best.end, best.start)):
            best = StopMatch(stop, start, start + len(stop))
    return best


texts = st.text(alphabet="abc😀", max_size=30)


@given(texts, st.lists(st.text(alphabet="abc😀", min_size=1, max_size=5), min_size=1, max_size=6), st.integers(0, 32))
@settings(max_examples=2000, deadline=None)
def test_same_as_one_find_per_stop(buffer: str, stops: list[str], min_end: int) -> None:
    assert earliest_stop(buffer, tuple(stops), min_end) == naive_earliest_stop(buffer, tuple(stops), min_end)


def test_nested_and_overlapping_stops():
    stops = ("abcdefg", "cde", "bcd", "he", "she", "hers")
    for buffer in ("xabcdefgh", "ushers", "abcd", "", "cdcde"):
        for min_end in range(len(buffer) + 2):
            assert earliest_stop(buffer, stops, min_end) == naive_earliest_stop(buffer, stops, min_end), (buffer, min_end)
