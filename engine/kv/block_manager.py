"""Each sequence's KV block table, grown as its tokens are scheduled, its use of the prefix cache,
and forks that share a parent's blocks copy-on-write (beam search)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.kv.block_pool import BlockHash, BlockPool, PoolExhaustedError, hash_block
from engine.kv.sequence_blocks import SequenceBlocks
from engine.request import Request


@dataclass
class PrefixCacheStats:
    """Prompt tokens looked up in the prefix cache when requests were admitted, and those found."""

    queried_tokens: int = 0
    hit_tokens: int = 0


BlockCopy = tuple[int, int]
"""(source block, destination block): the destination must get the source's keys and values."""


class BlockManager:
    """Hands blocks of a `BlockPool` to sequences (`Request.kv`) and finds their cached prefixes.

    A forked sequence lists its parent's blocks, each held once more. The block a sequence
    next writes into is copied first when another table lists it too (copy-on-write): the
    copy is queued in ``pending_copies`` for the device to run before the step that writes.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.stats = PrefixCacheStats()
        self.pending_copies: list[BlockCopy] = []

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    def blocks_for(self, num_positions: int) -> int:
        """Blocks that hold ``num_positions`` positions."""
        return -(-num_positions // self.block_size)

    def match_prefix(self, sequence: Request, num_cacheable: int) -> int:
        """Give a sequence without blocks the cached blocks its first ``num_cacheable`` known tokens start
        with, as computed tokens; return how many. Tokens whose logits are needed are left to compute
        (`Scheduler.num_cacheable`)."""
        assert not sequence.kv.block_ids and sequence.num_computed_tokens == 0
        if not self.enable_prefix_caching:
            return 0
        for block_hash in self._hashes(sequence, num_cacheable // self.block_size):
            block = self.pool.take_cached(block_hash)
            if block is None:
                break
            sequence.kv.block_ids.append(block)
        sequence.kv.num_registered = len(sequence.kv.block_ids)
        sequence.num_computed_tokens = len(sequence.kv.block_ids) * self.block_size
        return sequence.num_computed_tokens

    def reserve(self, sequence: Request, num_positions: int) -> bool:
        """Make the sequence's table cover ``num_positions``, its first block to write unshared;
        False (nothing taken) if the pool is short."""
        block_ids = sequence.kv.block_ids
        missing = max(self.blocks_for(num_positions) - len(block_ids), 0)
        write_index = sequence.num_computed_tokens // self.block_size
        shared = write_index < len(block_ids) and self.pool.ref_counts[block_ids[write_index]] > 1
        if missing + shared == 0:
            return True
        try:
            new_blocks = self.pool.allocate(missing + shared)
        except PoolExhaustedError:
            return False
        if shared:
            copy = new_blocks.pop()
            self.pending_copies.append((block_ids[write_index], copy))
            self.pool.release([block_ids[write_index]])
            block_ids[write_index] = copy
        block_ids += new_blocks
        return True

    def fork(self, parent: Request, child: Request) -> None:
        """Give ``child`` (no blocks yet) the parent's blocks and computed tokens, shared copy-on-write."""
        assert not child.kv.block_ids
        self.pool.share(parent.kv.block_ids)
        child.kv = SequenceBlocks(list(parent.kv.block_ids), list(parent.kv.hashes), parent.kv.num_registered)
        child.num_computed_tokens = parent.num_computed_tokens

    def take_copies(self) -> list[BlockCopy]:
        """The copy-on-write copies queued since the last call, in order."""
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def register_full_blocks(self, sequence: Request, num_positions: int) -> None:
        """Cache the sequence's full blocks within its first ``num_positions`` (computed, known tokens)."""
        if not self.enable_prefix_caching:
            return
        kv = sequence.kv
        num_full = num_positions // self.block_size
        hashes = self._hashes(sequence, num_full)
        for index in range(kv.num_registered, num_full):
            self.pool.register(kv.block_ids[index], hashes[index])
        kv.num_registered = max(kv.num_registered, num_full)

    def _hashes(self, sequence: Request, count: int) -> list[BlockHash]:
        """The hash chain of the sequence's first ``count`` blocks, extending the memoized one."""
        hashes = sequence.kv.hashes
        size = self.block_size
        while len(hashes) < count:
            start = len(hashes) * size
            hashes.append(hash_block(hashes[-1] if hashes else None, sequence.token_ids(start, start + size)))
        return hashes[:count]

    def trim(self, sequence: Request) -> None:
        """Release blocks past the sequence's computed tokens (after rejected drafts)."""
        keep = self.blocks_for(sequence.num_computed_tokens)
        assert keep >= sequence.kv.num_registered
        self.pool.release(reversed(sequence.kv.block_ids[keep:]))
        del sequence.kv.block_ids[keep:]

    def release(self, sequence: Request) -> None:
        """Release all the sequence's blocks, last first (so its cached tail is evicted before its head)."""
        self.pool.release(reversed(sequence.kv.block_ids))
        sequence.kv.block_ids = []
        sequence.kv.num_registered = 0
        sequence.num_computed_tokens = 0
