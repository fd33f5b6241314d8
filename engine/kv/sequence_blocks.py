"""One sequence's KV block table, as the sequence carries it (`Request.kv`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.kv.block_pool import BlockHash


@dataclass
class SequenceBlocks:
    """One sequence's blocks: ``block_ids[i]`` holds its positions ``[i * block_size, (i + 1) * block_size)``."""

    block_ids: list[int] = field(default_factory=list)
    hashes: list[BlockHash] = field(default_factory=list)
    """Hash chain of the sequence's leading full blocks of known tokens (kept across preemption)."""
    num_registered: int = 0
    """Leading blocks of ``block_ids`` that are in the prefix cache."""
