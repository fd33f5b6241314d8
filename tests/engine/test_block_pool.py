"""`BlockPool` bookkeeping under any sequence of operations: every block is free, held or cached-and-evictable, never two."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kv.block_pool import BlockPool, PoolExhaustedError

NUM_BLOCKS = 6
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("allocate"), st.integers(1, NUM_BLOCKS + 1)),
        st.tuples(st.just("release"), st.integers(0, 20)),
        st.tuples(st.just("register"), st.integers(0, 20)),
        st.tuples(st.just("take"), st.integers(0, 4)),
    ),
    max_size=60,
)


def assert_consistent(pool: BlockPool, holds: list[int]) -> None:
    free, evictable = set(pool.free), set(pool.evictable)
    held = {block for block in range(NUM_BLOCKS) if pool.ref_counts[block] > 0}
    assert free | evictable | held == set(range(NUM_BLOCKS))
    assert len(free) + len(evictable) + len(held) == NUM_BLOCKS  # disjoint
    assert all(pool.ref_counts[block] == holds.count(block) for block in range(NUM_BLOCKS))
    assert all(pool.block_hashes[block] is None for block in free)
    assert all(pool.cached[pool.block_hashes[block]] == block for block in evictable)
    assert {block for block, block_hash in enumerate(pool.block_hashes) if block_hash is not None} == set(pool.cached.values())


@settings(max_examples=300, deadline=None)
@given(OPERATIONS)
def test_every_block_is_in_exactly_one_state(operations):
    pool = BlockPool(NUM_BLOCKS)
    holds: list[int] = []  # one entry per hold, as a request's tables would keep them
    for name, value in operations:
        if name == "allocate":
            if value > pool.num_available:
                with pytest.raises(PoolExhaustedError):
                    pool.allocate(value)
            else:
                holds += pool.allocate(value)
        elif name == "release" and holds:
            pool.release([holds.pop(value % len(holds))])
        elif name == "register" and holds:
            pool.register(holds[value % len(holds)], bytes([value % 5]))
        elif name == "take":
            block = pool.take_cached(bytes([value]))
            assert (block is None) == (bytes([value]) not in pool.cached)
            if block is not None:
                holds.append(block)
        assert_consistent(pool, holds)


def test_evicts_the_least_recently_released_cached_block_first():
    pool = BlockPool(3)
    first, second, third = pool.allocate(3)
    for block, block_hash in ((first, b"a"), (second, b"b"), (third, b"c")):
        pool.register(block, block_hash)
    pool.release([second, first, third])
    assert pool.take_cached(b"a") == first  # revived: no longer evictable
    assert pool.allocate(1) == [second]  # released first
    assert pool.take_cached(b"b") is None and pool.take_cached(b"c") == third
