"""`freeze_startup_heap`: what start-up left as garbage is collected, the rest frozen out of full collections."""

from __future__ import annotations

import gc
import weakref

from deployments.startup_heap import freeze_startup_heap


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_garbage_goes_and_the_rest_is_frozen():
    kept = [Node() for _ in range(1_000)]
    cycle = Node()
    cycle.other = Node()
    cycle.other.other = cycle
    dead = weakref.ref(cycle)
    del cycle
    try:
        gc.unfreeze()
        freeze_startup_heap()
        assert dead() is None  # collected before freezing, not frozen forever
        assert gc.get_freeze_count() >= len(kept)
        assert all(gc.is_tracked(node) for node in kept)
    finally:
        gc.unfreeze()
