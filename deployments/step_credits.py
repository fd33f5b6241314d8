"""`StepCredits`: the engine starts a step only once its subscribers have caught up with it.

A subscriber (an ingress replica's output loop) takes step k's outputs with one poll,
routes them (stop strings are found there), and sends the resulting aborts with its next
poll, which so *acknowledges* step k. The engine starts step j only when every output of
step ``j - lead_steps`` or earlier has been acknowledged, so an abort caused by step k's
outputs is applied before step ``k + lead_steps`` runs: at most ``lead_steps - 1`` steps
are wasted, whatever the load. A subscriber that does not acknowledge within ``wait_s``
is excused (not waited for) until its next poll, so a slow or dead ingress cannot stall
the engine for more than ``wait_s`` per poll of its own.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable


class StepCredits:
    """Thread-safe: the engine thread publishes and waits, the actor's event loop acknowledges."""

    def __init__(self, lead_steps: int, wait_s: float) -> None:
        self.lead_steps = lead_steps
        self.wait_s = wait_s
        self.changed = threading.Condition()
        self.unacknowledged: dict[str, deque[int]] = {}  # subscriber -> steps with outputs for it, oldest first
        self.excused: set[str] = set()

    def published(self, subscribers: Iterable[str], step: int) -> None:
        """Step ``step`` has outputs for these subscribers (engine thread)."""
        with self.changed:
            for subscriber in subscribers:
                if subscriber not in self.excused:
                    self.unacknowledged.setdefault(subscriber, deque()).append(step)

    def acknowledged(self, subscriber: str, step: int) -> None:
        """``subscriber`` has routed every output up to step ``step`` and sent its aborts."""
        with self.changed:
            self.excused.discard(subscriber)
            steps = self.unacknowledged.get(subscriber)
            while steps and steps[0] <= step:
                steps.popleft()
            if not steps:
                self.unacknowledged.pop(subscriber, None)
            self.changed.notify_all()

    def forget(self, subscriber: str) -> None:
        """``subscriber`` is gone: never wait for it again."""
        with self.changed:
            self.unacknowledged.pop(subscriber, None)
            self.excused.discard(subscriber)
            self.changed.notify_all()

    def wait_to_start(self, step: int) -> list[str]:
        """Block until step ``step`` may start, at most ``wait_s``; the subscribers excused for being late."""
        deadline = time.monotonic() + self.wait_s
        with self.changed:
            while True:
                late = [s for s, steps in self.unacknowledged.items() if steps[0] <= step - self.lead_steps]
                remaining = deadline - time.monotonic()
                if not late:
                    return []
                if remaining <= 0:
                    for subscriber in late:
                        del self.unacknowledged[subscriber]
                        self.excused.add(subscriber)
                    return late
                self.changed.wait(remaining)
