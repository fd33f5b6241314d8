"""`FairShare`: the priority policy's queue keys (priority, turns between clients, arrival), no model."""

from __future__ import annotations

from engine.fair_share import FairShare


def admit_in_order(share: FairShare, queued: list[tuple[tuple[int, int, int], str]]) -> list[str]:
    """Admit every queued (key, client) in key order; the clients in that order."""
    order = []
    for key, client in sorted(queued):
        share.admitted(key, client)
        order.append(client)
    return order


def test_lower_priority_value_comes_first_whatever_the_arrival():
    share = FairShare()
    late_urgent = [(share.key(5, "a"), "a"), (share.key(5, "a"), "a"), (share.key(-1, "b"), "b")]
    assert admit_in_order(share, late_urgent) == ["b", "a", "a"]


def test_a_burst_does_not_starve_a_later_client():
    share = FairShare()
    queued = [(share.key(0, "burst"), "burst") for _ in range(50)]
    queued.append((share.key(0, "late"), "late"))
    order = admit_in_order(share, queued)
    assert order.index("late") <= 1, order  # behind at most one of the burst's requests


def test_clients_take_turns_within_a_priority():
    share = FairShare()
    queued = [(share.key(0, client), client) for client in ["a"] * 4 + ["b"] * 4 + ["c"] * 2]
    assert admit_in_order(share, queued)[:6] == ["a", "b", "c", "a", "b", "c"]


def test_a_newcomer_starts_from_the_time_of_the_last_admitted():
    share = FairShare()
    first = [(share.key(0, "a"), "a") for _ in range(3)]
    admit_in_order(share, first[:2])  # two of a's three ran
    key_b = share.key(0, "b")
    assert first[2][0] < key_b  # a's queued request keeps its turn: b does not jump it
    assert key_b[1] == 3  # but starts at the time of the last admitted, not at 1


def test_state_goes_with_the_last_request_of_a_priority():
    share = FairShare()
    keys = [share.key(priority, f"client{i}") for i, priority in enumerate([0, 0, 7])]
    for key in keys:
        share.released(key)
    assert share.num_clients == 0
    assert share.key(0, "client0")[1] == 1  # time at priority 0 starts again
