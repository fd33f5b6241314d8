"""`EncodeBacklog`: the client text an ingress replica's encode workers hold, bounded.

The workers are shared by every request of the replica, so their queue is bounded by the work
it holds: each job (a request's prompts, its chat template, its strings, its grammar check) is
charged its text's UTF-8 bytes plus `JOB_BYTES`, from when it is queued until it ends (also
when its client has left). A job that would take the backlog past its limit is refused, and
the refusal goes to the request that brought it; a backlog with nothing in it takes any job,
so a request the other limits admit can always run.
"""

from __future__ import annotations

import threading

JOB_BYTES = 1024


class EncodeBacklog:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held = 0
        self._lock = threading.Lock()

    def take(self, charge: int) -> bool:
        """Hold ``charge`` bytes if they fit (or nothing is held); False when they do not."""
        with self._lock:
            if self.held and self.held + charge > self.max_bytes:
                return False
            self.held += charge
            return True

    def give(self, charge: int) -> None:
        """Release what `take` held (from any thread: jobs end on the workers)."""
        with self._lock:
            self.held -= charge
