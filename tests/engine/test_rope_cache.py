"""The C++ rope-and-cache kernel against torch's rotary embedding and cache writes, bit for bit, and its refusals."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kernels import rope_cache
from engine.loader.random_shapes import RANDOM_MODEL_SHAPES, TINY_RANDOM
from engine.models.rope import RotaryEmbedding

pytestmark = pytest.mark.skipif(rope_cache.load() is None, reason="the kernel cannot be built here (no C++ compiler)")

NUM_BLOCKS = 48
"""Slots for every token of the largest example at block size 1."""
MAX_POSITIONS = 300


def rope_table(head_dim: int, scaling: dict | None) -> RotaryEmbedding:
    config = replace(RANDOM_MODEL_SHAPES[TINY_RANDOM], head_dim=head_dim, max_position_embeddings=MAX_POSITIONS, rope_scaling=scaling)
    return RotaryEmbedding(config, MAX_POSITIONS)


@settings(max_examples=40, deadline=None)
@given(
    heads=st.sampled_from([(9, 3), (4, 4), (2, 1)]),
    head_dim=st.sampled_from([2, 16, 64, 128]),
    block_size=st.sampled_from([1, 4, 16]),
    num_tokens=st.integers(1, 40),
    scaling=st.sampled_from([None, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}]),
    magnitude=st.sampled_from([1e-3, 1.0, 1e4]),
    merged=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_kernel_is_torch_bit_for_bit(heads, head_dim, block_size, num_tokens, scaling, magnitude, merged, seed):
    assert_torch_bit_for_bit(rope_cache.rope_and_write_cache, heads, head_dim, block_size, num_tokens, scaling, magnitude, merged, seed)


def assert_torch_bit_for_bit(
    rope_and_write_cache, heads, head_dim, block_size, num_tokens, scaling, magnitude, merged, seed, dtype=torch.float32, device="cpu"
) -> None:
    """``rope_and_write_cache`` gives torch's rotation and cache writes exactly. ``merged``: q, k and v
    are column views of one [T, (H + 2 KVH) D] tensor, as a merged projection gives them."""
    num_heads, num_kv_heads = heads
    generator = torch.Generator().manual_seed(seed)
    rope = rope_table(head_dim, scaling).to(device)
    q = torch.randn(num_tokens, num_heads, head_dim, generator=generator) * magnitude
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=generator) * magnitude
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=generator)
    q, k, v = (x.to(device, dtype) for x in (q, k, v))
    if merged:
        joint = torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], dim=1)
        q_columns, k_columns = num_heads * head_dim, num_kv_heads * head_dim
        q = joint[:, :q_columns].view(num_tokens, num_heads, head_dim)
        k = joint[:, q_columns : q_columns + k_columns].view(num_tokens, num_kv_heads, head_dim)
        v = joint[:, q_columns + k_columns :].view(num_tokens, num_kv_heads, head_dim)
    k_before = k.clone()
    positions = torch.randint(0, MAX_POSITIONS, (num_tokens,), generator=generator).to(device)
    slots = torch.randperm(NUM_BLOCKS * block_size, generator=generator)[:num_tokens].to(device)
    blocks, offsets = slots // block_size, slots % block_size
    cache_shape = (NUM_BLOCKS, block_size, num_kv_heads, head_dim)
    key_cache, value_cache = (torch.randn(cache_shape, generator=generator).to(device, dtype) for _ in range(2))
    expected_q, expected_k = rope(q.clone(), k.clone(), positions)
    expected_keys, expected_values = key_cache.clone(), value_cache.clone()
    expected_keys[blocks, offsets] = expected_k
    expected_values[blocks, offsets] = v

    rope_and_write_cache(q, k, v, rope.cos, rope.sin, positions, blocks, offsets, key_cache, value_cache)

    assert torch.equal(q, expected_q)
    assert torch.equal(k, k_before)  # rotated into the cache only
    assert torch.equal(key_cache, expected_keys)
    assert torch.equal(value_cache, expected_values)


def valid_arguments() -> dict[str, torch.Tensor]:
    rope = rope_table(8, None)
    return {
        "q": torch.zeros(2, 3, 8),
        "k": torch.zeros(2, 1, 8),
        "v": torch.zeros(2, 1, 8),
        "cos": rope.cos,
        "sin": rope.sin,
        "positions": torch.tensor([0, 5]),
        "blocks": torch.tensor([0, 1]),
        "offsets": torch.tensor([3, 0]),
        "key_cache": torch.zeros(2, 4, 1, 8),
        "value_cache": torch.zeros(2, 4, 1, 8),
    }


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("positions", torch.tensor([0, MAX_POSITIONS]), "outside the rotary tables"),
        ("positions", torch.tensor([-1, 0]), "outside the rotary tables"),
        ("blocks", torch.tensor([0, 2]), "outside the cache"),
        ("offsets", torch.tensor([4, 0]), "outside the cache"),
        ("offsets", torch.tensor([0]), "must be \\[T\\] int64"),
        ("positions", torch.tensor([0, 1], dtype=torch.int32), "must be \\[T\\] int64"),
        ("q", torch.zeros(2, 3, 8, dtype=torch.float64), "q must be float32 \\[T, heads, D\\] with each token's heads contiguous"),
        ("k", torch.zeros(2, 1, 6), "k and v must be"),
        ("key_cache", torch.zeros(2, 4, 2, 8), "caches must be"),
        ("q", torch.zeros(2, 8, 3).transpose(1, 2), "q must be float32 \\[T, heads, D\\] with each token's heads contiguous"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_written(name, value, message):
    arguments = valid_arguments()
    arguments[name] = value
    with pytest.raises(RuntimeError, match=message):
        rope_cache.rope_and_write_cache(**arguments)
    assert not arguments["key_cache"].any() and not arguments["value_cache"].any()


def test_index_columns_of_one_tensor_are_taken():
    """A CUDA-graph-style step keeps position, block and offset as columns of one [T, 3] tensor."""
    arguments = valid_arguments()
    expected = valid_arguments()
    columns = torch.stack([arguments["positions"], arguments["blocks"], arguments["offsets"]], dim=1)
    arguments |= {"positions": columns[:, 0], "blocks": columns[:, 1], "offsets": columns[:, 2]}
    arguments["k"] = expected["k"] = torch.ones(2, 1, 8)
    rope_cache.rope_and_write_cache(**arguments)
    rope_cache.rope_and_write_cache(**expected)
    assert torch.equal(arguments["key_cache"], expected["key_cache"]) and arguments["key_cache"].any()
