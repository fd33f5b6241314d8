"""The waiting queue's order under the ``priority`` scheduling policy: by priority (lower value
first, as vLLM's), then by a fair share between clients, then by arrival.

Within a priority, each client's requests take turns (start-time fair queuing with a unit cost per
request): a request's tag is one more than the later of its client's last tag and the tag of the
last request admitted at that priority. A client's burst of 100 requests gets tags 1..100; another
client's request arriving after it gets the tag of the next request admitted, so it waits behind
at most one request of each other client, not behind the whole burst.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import Enum

QueueKey = tuple[int, int, int]
"""(priority, fair-share tag, arrival): smaller runs first."""
HEAD_KEY: QueueKey = (-(2**63), 0, 0)
"""The key of a sequence queued by the engine itself (a beam forked from a running search): first."""


class SchedulingPolicy(str, Enum):
    """vLLM's ``scheduling_policy``: ``fcfs`` keeps arrival order and refuses priorities other than 0."""

    FCFS = "fcfs"
    PRIORITY = "priority"


@dataclass
class FairShare:
    """Hands out `QueueKey`s and advances each priority's virtual time as requests are admitted.

    What it keeps is bounded by the live requests: a priority's state goes once none of its requests is left.
    """

    _virtual: dict[int, int] = field(default_factory=dict)
    """Per priority: the tag of the latest request admitted."""
    _last_tag: dict[int, dict[str, int]] = field(default_factory=dict)
    """Per priority, per client: the tag of the client's latest request, while ahead of the virtual time."""
    _live: dict[int, int] = field(default_factory=dict)
    """Per priority: requests given a key and not yet released (queued, running or preempted)."""
    _arrivals: itertools.count = field(default_factory=itertools.count)

    def key(self, priority: int, client: str) -> QueueKey:
        """The key of a new request of ``client`` at ``priority``."""
        clients = self._last_tag.setdefault(priority, {})
        tag = max(self._virtual.get(priority, 0), clients.get(client, 0)) + 1
        clients[client] = tag
        self._live[priority] = self._live.get(priority, 0) + 1
        return priority, tag, next(self._arrivals)

    def admitted(self, key: QueueKey, client: str) -> None:
        """A request left the queue to run: time at its priority moves to its tag; a client whose
        last tag it has reached is forgotten (its next request starts from the virtual time anyway)."""
        priority, tag, _ = key
        now = max(self._virtual.get(priority, 0), tag)
        self._virtual[priority] = now
        clients = self._last_tag.get(priority, {})
        if clients.get(client, now + 1) <= now:
            del clients[client]

    def released(self, key: QueueKey) -> None:
        """A request with ``key`` finished or was aborted."""
        priority = key[0]
        self._live[priority] -= 1
        if not self._live[priority]:
            for state in (self._live, self._virtual, self._last_tag):
                state.pop(priority, None)

    @property
    def num_clients(self) -> int:
        """Clients with requests ahead of their priority's virtual time (what this keeps in memory)."""
        return sum(len(clients) for clients in self._last_tag.values())
