"""Forked block tables share their parent's KV blocks copy-on-write; every hold is let go on release."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kv.block_manager import BlockManager
from engine.kv.kv_cache import PagedKVCache
from engine.loader.random_shapes import RANDOM_MODEL_SHAPES, TINY_RANDOM
from engine.request import Request
from sampling.params import SamplingParams

BLOCK_SIZE = 4
NUM_BLOCKS = 12


def sequence(num_tokens: int) -> Request:
    return Request("r", list(range(num_tokens)), SamplingParams())


def computed(manager: BlockManager, num_tokens: int) -> Request:
    """A sequence whose ``num_tokens`` tokens are all in the cache."""
    request = sequence(num_tokens)
    assert manager.reserve(request, num_tokens)
    request.num_computed_tokens = num_tokens
    return request


def forked(manager: BlockManager, parent: Request) -> Request:
    child = sequence(parent.num_tokens)
    manager.fork(parent, child)
    return child


def holds(*sequences: Request) -> list[int]:
    """How many tables list each block."""
    return [sum(table.kv.block_ids.count(block) for table in sequences) for block in range(NUM_BLOCKS)]


def test_a_fork_shares_every_block_and_computed_token():
    manager = BlockManager(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=False)
    parent = computed(manager, 6)
    child = forked(manager, parent)
    assert child.kv.block_ids == parent.kv.block_ids and child.num_computed_tokens == 6
    assert [manager.pool.ref_counts[b] for b in parent.kv.block_ids] == [2, 2]
    assert manager.pool.num_held == 2


def test_writing_a_shared_partial_block_copies_it_once():
    manager = BlockManager(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=False)
    parent = computed(manager, 6)  # blocks [full, 2 of 4 positions]
    child = forked(manager, parent)
    full, partial = parent.kv.block_ids
    assert manager.reserve(child, 7)
    copy = child.kv.block_ids[1]
    assert child.kv.block_ids[0] == full and copy != partial
    assert manager.take_copies() == [(partial, copy)]
    assert manager.pool.ref_counts[full] == 2 and manager.pool.ref_counts[partial] == 1 and manager.pool.ref_counts[copy] == 1
    assert manager.reserve(parent, 7)  # the parent now holds its partial block alone: written in place
    assert parent.kv.block_ids == [full, partial] and manager.take_copies() == []


def test_a_fork_at_a_block_boundary_copies_nothing():
    manager = BlockManager(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=False)
    parent = computed(manager, 8)
    child = forked(manager, parent)
    assert manager.reserve(child, 9)
    assert child.kv.block_ids[:2] == parent.kv.block_ids and len(child.kv.block_ids) == 3
    assert manager.take_copies() == []


def test_a_copy_the_pool_cannot_hold_takes_nothing():
    manager = BlockManager(2, BLOCK_SIZE, enable_prefix_caching=False)
    parent = computed(manager, 6)
    child = forked(manager, parent)
    assert not manager.reserve(child, 7)
    assert child.kv.block_ids == parent.kv.block_ids and manager.take_copies() == [] and manager.pool.num_available == 0


def test_releasing_every_fork_returns_the_pool_to_full():
    manager = BlockManager(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=True)
    parent = computed(manager, 6)
    manager.register_full_blocks(parent, 6)
    children = [forked(manager, parent) for _ in range(3)]
    for child in children:
        assert manager.reserve(child, 7)
    full = parent.kv.block_ids[0]
    manager.release(parent)
    assert manager.pool.ref_counts[full] == 3
    for child in children:
        manager.release(child)
    assert manager.pool.num_available == NUM_BLOCKS and sum(manager.pool.ref_counts) == 0


OPERATIONS = st.lists(
    st.tuples(st.sampled_from(["fork", "grow", "release"]), st.integers(0, 7), st.integers(1, 5)),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(OPERATIONS)
def test_reference_counts_equal_the_tables_that_list_each_block(operations):
    manager = BlockManager(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=False)
    live = [computed(manager, 3)]
    for name, which, grow in operations:
        if not live:
            break
        target = live[which % len(live)]
        if name == "fork":
            live.append(forked(manager, target))
        elif name == "grow" and manager.reserve(target, target.num_computed_tokens + grow):
            target.num_computed_tokens += grow
            target.prompt_token_ids += [0] * grow
        elif name == "release":
            manager.release(target)
            live.remove(target)
        assert manager.pool.ref_counts == holds(*live)
        for table in live:  # a block a sequence writes next is its own
            index = table.num_computed_tokens // BLOCK_SIZE
            if index < len(table.kv.block_ids) and table.num_computed_tokens % BLOCK_SIZE:
                assert manager.pool.ref_counts[table.kv.block_ids[index]] >= 1
    for table in live:
        manager.release(table)
    assert manager.pool.num_available == NUM_BLOCKS


def test_copy_blocks_copies_keys_and_values_of_every_layer():
    cache = PagedKVCache(RANDOM_MODEL_SHAPES[TINY_RANDOM], num_blocks=4, block_size=2, dtype=torch.float32, device=torch.device("cpu"))
    for layer in (*cache.keys, *cache.values):
        layer.copy_(torch.randn(layer.shape))
    before = [layer.clone() for layer in (*cache.keys, *cache.values)]
    cache.copy_blocks([(1, 3), (0, 2), (1, 2)])  # two copies to block 2: the last counts
    for layer, old in zip((*cache.keys, *cache.values), before):
        assert torch.equal(layer[3], old[1]) and torch.equal(layer[2], old[1]) and torch.equal(layer[:2], old[:2])
