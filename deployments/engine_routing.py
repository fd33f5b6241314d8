"""`EngineRouting`: which engine a new request goes to, by its prompt's prefix and the engines' load.

No Ray and no state shared between ingress replicas: requests that start with the same tokens meet
on the same engine, whose prefix cache then holds their common blocks; replicas agree on it from the
prompt alone while the loads are even, and each keeps a bounded memory of where it sent its keys.

- The key is a hash (blake2b) of the prompt's first ``prefix_tokens`` token ids, a whole number of
  KV blocks. Only a prompt with more than that many tokens has a key (the engine reuses every
  cached block but the one holding the last token); a shorter one goes to the least-loaded engine.
  The key is of a fixed length, not of as many blocks as the prompt has: every chat prompt begins
  with its template's header (24 tokens for the default model's, with its default system prompt),
  so short prompts keyed by their few blocks would all share a key and pile onto one engine; and
  a conversation keeps its key as it grows turn by turn, so each turn finds the last one's blocks.
- The engines that are up are ranked for the key by rendezvous (highest-random-weight) hashing:
  each engine's score is a hash of (key, engine index), highest first. The ranking breaks ties for
  a new key and orders where a key spills; an engine that goes down moves only the keys whose home
  it was, every other key keeps its engine.
- A key the replica has not seen (in its `KeyHomes`, a bounded memory of recent keys) goes to the
  least-loaded engine, the ranking breaking ties, which becomes the key's home: a prompt that shares
  nothing is then placed as the least-loaded policy places it (keyed placement alone spread such
  prompts at random within the slack, and cost them time to first token). With equal loads every
  replica gives a new key the same home, its ranking's first engine.
- A key seen before goes to its home while the home's load (live choices) is within the slack of
  the least-loaded engine's: ``load_slack`` choices more, or ``load_slack_fraction`` more in
  proportion, whichever is larger. An overloaded home is never chosen for its cache; the key spills
  to the next engine of its ranking within the slack, which then caches it too (a hot prefix spreads
  as it grows), and comes back home when the load evens out. A key whose home is down is new again.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

KEY_BYTES = 8
KEY_HOMES_CAPACITY = 16384
"""Keys a replica remembers the home of (the least recently routed are forgotten): about 2 MB (tracemalloc)."""


class Placement(StrEnum):
    """How a request's engine was chosen (the ``placement`` label of ``spout:engine_routing_total``)."""

    AFFINITY = "affinity"
    """Its key's home: where the replica sent the key first."""
    SPILLED = "spilled"
    """Another engine of its key's ranking: the home ran past the load slack."""
    NEW_KEY = "new_key"
    """A key the replica had not seen: the least-loaded engine, now the key's home."""
    LEAST_LOADED = "least_loaded"
    """No key (a short prompt), or the least-loaded policy."""


@dataclass(frozen=True)
class Pick:
    engine: int
    placement: Placement


class RoutingPolicy(StrEnum):
    PREFIX = "prefix"
    """By the prompt's prefix (rendezvous ranking), within the load slack; least-loaded without a key."""
    LEAST_LOADED = "least_loaded"
    """The engine with the fewest live choices, whatever the prompt."""


class KeyHomes:
    """One replica's memory of each recent key's home engine: at most ``capacity`` keys, the least
    recently routed forgotten first (a forgotten key is new again)."""

    def __init__(self, capacity: int = KEY_HOMES_CAPACITY) -> None:
        self.capacity = capacity
        self.homes: OrderedDict[bytes, int] = OrderedDict()

    def get(self, key: bytes) -> int | None:
        home = self.homes.get(key)
        if home is not None:
            self.homes.move_to_end(key)
        return home

    def set(self, key: bytes, engine: int) -> None:
        self.homes[key] = engine
        self.homes.move_to_end(key)
        if len(self.homes) > self.capacity:
            self.homes.popitem(last=False)


@dataclass(frozen=True)
class EngineRouting:
    """How an ingress replica picks an engine for a request (see the module's docstring)."""

    policy: RoutingPolicy = RoutingPolicy.LEAST_LOADED
    """The server's default too (``engine_routing``): prefix routing is the operator's choice."""
    prefix_tokens: int = 64
    """Tokens the key covers: a whole number of KV blocks, more than any chat template's header."""
    load_slack: int = 4
    """Live choices an engine may run above the least-loaded engine's and still be chosen for a key."""
    load_slack_fraction: float = 0.25
    """The same slack in proportion to the least-loaded engine's choices (the larger of the two applies)."""

    def __post_init__(self) -> None:
        if self.prefix_tokens < 1:
            raise ValueError(f"prefix_tokens must be at least 1, got {self.prefix_tokens}")
        if self.load_slack < 0 or self.load_slack_fraction < 0:
            raise ValueError(f"the load slack must be at least 0, got {self.load_slack} and {self.load_slack_fraction}")

    def prefix_key(self, prompt: Sequence[int]) -> bytes | None:
        """The hash of the prompt's first ``prefix_tokens`` ids; None when the prompt has no more tokens than that."""
        if self.policy is RoutingPolicy.LEAST_LOADED or len(prompt) <= self.prefix_tokens:
            return None
        ids = struct.pack(f"<{self.prefix_tokens}I", *prompt[: self.prefix_tokens])
        return hashlib.blake2b(ids, digest_size=KEY_BYTES).digest()

    def pick(self, prompt: Sequence[int], live: Sequence[int], up: Sequence[int], homes: KeyHomes) -> Pick:
        """The engine for a request with ``prompt``, and how it was chosen: ``live[i]`` is engine i's
        live choices, ``up`` the indices of the engines that are up (at least one), ``homes`` the
        replica's memory of its keys' homes (updated here)."""
        if not up:
            raise ValueError("no engine is up")
        least = min(up, key=live.__getitem__)
        key = self.prefix_key(prompt)
        if key is None:
            return Pick(least, Placement.LEAST_LOADED)
        ranking = rendezvous_ranking(key, up)
        home = homes.get(key)
        if home is None or home not in up:
            home = next(engine for engine in ranking if live[engine] == live[least])
            homes.set(key, home)
            return Pick(home, Placement.NEW_KEY)
        bound = live[least] + max(self.load_slack, self.load_slack_fraction * live[least])
        if live[home] <= bound:
            return Pick(home, Placement.AFFINITY)
        return Pick(next(engine for engine in ranking if live[engine] <= bound), Placement.SPILLED)


def rendezvous_ranking(key: bytes, engines: Sequence[int]) -> list[int]:
    """``engines`` ordered by their score for ``key``, highest first (ties, which a 64-bit hash all
    but never makes, by index)."""
    return sorted(engines, key=lambda engine: (-_score(key, engine), engine))


def _score(key: bytes, engine: int) -> int:
    digest = hashlib.blake2b(key + struct.pack("<I", engine), digest_size=KEY_BYTES).digest()
    return int.from_bytes(digest, "little")
