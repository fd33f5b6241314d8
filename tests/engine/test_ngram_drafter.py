from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.ngram_drafter import NgramIndex


def brute_force_proposal(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The longest suffix n-gram's latest earlier occurrence, by scanning the whole sequence."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n :]
        for start in range(length - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


def test_proposes_what_followed_the_latest_match():
    index = NgramIndex(min_n=2, max_n=3)
    assert index.propose([1, 2, 3, 9, 1, 2, 4, 5, 1, 2], max_tokens=3) == [4, 5, 1]


def test_longest_ngram_wins():
    index = NgramIndex(min_n=1, max_n=3)
    # "2" alone last occurred before 8; "1 2" occurred before 3.
    assert index.propose([1, 2, 3, 4, 2, 8, 1, 2], max_tokens=2) == [3, 4]


def test_no_match_and_zero_budget():
    assert NgramIndex(2, 4).propose([1, 2, 3, 4], max_tokens=4) == []
    assert NgramIndex(1, 4).propose([1, 2, 1], max_tokens=0) == []


@given(
    chunks=st.lists(st.lists(st.integers(0, 3), max_size=6), min_size=1, max_size=8),
    sizes=st.tuples(st.integers(1, 4), st.integers(0, 3)),
    k=st.integers(0, 5),
)
def test_incremental_equals_a_full_scan(chunks: list[list[int]], sizes: tuple[int, int], k: int):
    min_n, max_n = sizes[0], sizes[0] + sizes[1]
    index, tokens = NgramIndex(min_n, max_n), []
    for chunk in chunks:
        tokens += chunk
        assert index.propose(chunk, k) == brute_force_proposal(tokens, min_n, max_n, k)
