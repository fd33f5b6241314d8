"""The KV block pool's bookkeeping: free blocks, reference counts, and the prefix cache.

Pure Python over block ids; the tensors live in `engine.kv.kv_cache.PagedKVCache`. A full
block whose tokens are known is registered under its `hash_block` (a chain over the
sequence's blocks so far), stays cached when its last holder lets go (reference count 0,
evictable), and is handed to any later sequence whose prompt starts with the same blocks.
Evictable blocks are reused least recently released first.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence

BlockHash = bytes
"""sha256 of the parent block's hash and this block's token ids."""


def hash_block(parent: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """The hash of a full block after ``parent`` (None for a sequence's first block).

    A cryptographic hash, as vLLM's: equal hashes mean equal token prefixes, so no client can
    craft a prompt that reads another prompt's keys and values.
    """
    digest = hashlib.sha256(parent or b"")
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


class PoolExhaustedError(RuntimeError):
    """`BlockPool.allocate` was asked for more blocks than are free or evictable."""


class BlockPool:
    """``num_blocks`` KV blocks: each free, held (reference count > 0) or cached and evictable."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self.block_hashes: list[BlockHash | None] = [None] * num_blocks
        self.free: deque[int] = deque(range(num_blocks))
        self.evictable: OrderedDict[int, None] = OrderedDict()
        """Cached blocks nobody holds, least recently released first."""
        self.cached: dict[BlockHash, int] = {}

    @property
    def num_available(self) -> int:
        """Blocks `allocate` can hand out: free ones, then evicted cached ones."""
        return len(self.free) + len(self.evictable)

    @property
    def num_held(self) -> int:
        return self.num_blocks - self.num_available

    def allocate(self, count: int) -> list[int]:
        """``count`` blocks, each held once; raises `PoolExhaustedError` (taking none) if too few."""
        if count > self.num_available:
            raise PoolExhaustedError(f"{count} blocks asked, {self.num_available} available")
        blocks = []
        for _ in range(count):
            block = self.free.popleft() if self.free else self._evict()
            self.ref_counts[block] = 1
            blocks.append(block)
        return blocks

    def _evict(self) -> int:
        block, _ = self.evictable.popitem(last=False)
        block_hash = self.block_hashes[block]
        assert block_hash is not None
        del self.cached[block_hash]
        self.block_hashes[block] = None
        return block

    def release(self, blocks: Iterable[int]) -> None:
        """Let go of one hold on each block, in order: cached ones released first are evicted first."""
        for block in blocks:
            self.ref_counts[block] -= 1
            assert self.ref_counts[block] >= 0, f"block {block} released more often than held"
            if self.ref_counts[block] == 0:
                if self.block_hashes[block] is None:
                    self.free.append(block)
                else:
                    self.evictable[block] = None

    def share(self, blocks: Iterable[int]) -> None:
        """Hold each of these held blocks once more (a forked sequence's table lists them too)."""
        for block in blocks:
            assert self.ref_counts[block] > 0, f"block {block} shared while not held"
            self.ref_counts[block] += 1

    def take_cached(self, block_hash: BlockHash) -> int | None:
        """The cached block with this hash, now held once more; None on a miss."""
        block = self.cached.get(block_hash)
        if block is None:
            return None
        if self.ref_counts[block] == 0:
            del self.evictable[block]
        self.ref_counts[block] += 1
        return block

    def register(self, block: int, block_hash: BlockHash) -> None:
        """Cache a held, full block under its hash; a block already cached with it stays the one found."""
        if block_hash not in self.cached and self.block_hashes[block] is None:
            self.cached[block_hash] = block
            self.block_hashes[block] = block_hash
