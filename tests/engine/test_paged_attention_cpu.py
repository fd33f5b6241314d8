"""The C++ paged-attention decode kernel against the torch gather path, its batch invariance, and the engine with it."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kernels import paged_attention
from engine.models import fused_kernels, llama
from tests.engine.mixed_workload import run_mixed
from tests.engine.test_paged_attention_triton import torch_decode_attention
from tests.engine.test_paged_kv import PRE_PAGING_TOKENS

pytestmark = pytest.mark.skipif(paged_attention.load() is None, reason="the kernel cannot be built here (no C++ compiler)")

NUM_BLOCKS = 48


def random_cache(generator: torch.Generator, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Key and value caches [NUM_BLOCKS, block_size, KVH, D] of standard normal values."""
    shape = (NUM_BLOCKS, block_size, num_kv_heads, head_dim)
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


def random_tables(generator: torch.Generator, batch: int, num_blocks: int) -> torch.Tensor:
    """[batch, num_blocks] int64: each sequence's distinct blocks in random order."""
    return torch.stack([torch.randperm(NUM_BLOCKS, generator=generator)[:num_blocks] for _ in range(batch)])


@settings(max_examples=25, deadline=None)
@given(
    heads=st.sampled_from([(4, 4), (9, 3), (8, 2), (6, 1)]),
    head_dim=st.sampled_from([16, 48, 64, 128]),
    block_size=st.sampled_from([1, 5, 16]),
    seq_lens=st.lists(st.integers(1, 70), min_size=1, max_size=6),
    table_dtype=st.sampled_from([torch.int32, torch.int64]),
    seed=st.integers(0, 1000),
)
def test_kernel_matches_the_gather_path(heads, head_dim, block_size, seq_lens, table_dtype, seed):
    num_heads, num_kv_heads = heads
    generator = torch.Generator().manual_seed(seed)
    key_cache, value_cache = random_cache(generator, block_size, num_kv_heads, head_dim)
    lens = torch.tensor(seq_lens)
    num_blocks = min(NUM_BLOCKS, -(-max(seq_lens) // block_size))
    lens = lens.clamp(max=num_blocks * block_size)
    tables = random_tables(generator, len(seq_lens), num_blocks)
    q = torch.randn(len(seq_lens), num_heads, head_dim, generator=generator) * 2
    ours = paged_attention.paged_decode_attention(q, key_cache, value_cache, tables.to(table_dtype), lens)
    torch.testing.assert_close(ours, torch_decode_attention(q, key_cache, value_cache, tables, lens), atol=1e-5, rtol=1e-5)


def test_a_sequence_alone_equals_it_in_a_batch():
    """Bit for bit: a sequence's output does not depend on the lengths or the number of the others."""
    generator = torch.Generator().manual_seed(3)
    key_cache, value_cache = random_cache(generator, 16, 3, 64)
    seq_lens = torch.tensor([37, 1, 200, 16, 129, 64, 5, 300])
    tables = random_tables(generator, len(seq_lens), 19)
    q = torch.randn(len(seq_lens), 9, 64, generator=generator)
    batch = paged_attention.paged_decode_attention(q, key_cache, value_cache, tables, seq_lens)
    for index in range(len(seq_lens)):
        alone = paged_attention.paged_decode_attention(q[index : index + 1], key_cache, value_cache, tables[index : index + 1], seq_lens[index : index + 1])
        assert torch.equal(alone, batch[index : index + 1]), index
    first_three = paged_attention.paged_decode_attention(q[:3], key_cache, value_cache, tables[:3, :13], seq_lens[:3])  # a narrower table
    assert torch.equal(first_three, batch[:3])


def test_queries_that_are_column_views_of_a_merged_projection_read_in_place():
    """q as the first columns of a [B, (H + 2 KVH) D] projection output (sequences a row stride apart): the
    same bits as a contiguous q, with the output contiguous; a q whose heads are not contiguous is copied first."""
    generator = torch.Generator().manual_seed(4)
    key_cache, value_cache = random_cache(generator, 16, 3, 64)
    seq_lens = torch.tensor([37, 1, 200, 16])
    tables = random_tables(generator, len(seq_lens), 13)
    joint = torch.randn(len(seq_lens), (9 + 2 * 3) * 64, generator=generator)
    q = joint[:, : 9 * 64].view(len(seq_lens), 9, 64)
    expected = paged_attention.paged_decode_attention(q.contiguous(), key_cache, value_cache, tables, seq_lens)
    ours = paged_attention.paged_decode_attention(q, key_cache, value_cache, tables, seq_lens)
    assert ours.is_contiguous() and torch.equal(ours, expected)
    heads_apart = q.transpose(0, 1).contiguous().transpose(0, 1)  # [B, H, D] with a sequence's heads B * D apart
    assert torch.equal(paged_attention.paged_decode_attention(heads_apart, key_cache, value_cache, tables, seq_lens), expected)


@pytest.mark.parametrize(
    ("head_dim", "seq_len", "block", "message"),
    [(24, 4, 0, "head_dim"), (16, 0, 0, "seq_lens"), (16, 33, 0, "seq_lens"), (16, 4, NUM_BLOCKS, "block_tables")],
)
def test_kernel_refuses_what_it_cannot_read(head_dim, seq_len, block, message):
    key_cache, value_cache = random_cache(torch.Generator().manual_seed(0), 16, 2, head_dim)
    q = torch.zeros(1, 2, head_dim)
    with pytest.raises(RuntimeError, match=message):
        paged_attention.paged_decode_attention(q, key_cache, value_cache, torch.tensor([[block, 1]]), torch.tensor([seq_len]))


def test_engine_with_the_kernel_gives_the_pre_paging_tokens(tiny_checkpoint, monkeypatch):
    """The float32 CPU engine attends its decode groups through the kernel and still gives the tokens of the gather path."""
    kernel = paged_attention.paged_decode_attention
    calls = []

    def counted_kernel(q, *args):
        calls.append(q.shape[0])
        return kernel(q, *args)

    monkeypatch.setattr(paged_attention, "paged_decode_attention", counted_kernel)  # the decode steps' (`CpuDecode`)
    cpu_kernels = dataclasses.replace(fused_kernels.for_device_type("cpu"), paged_decode_attention=counted_kernel)
    monkeypatch.setattr(llama, "for_device_type", lambda device_type: cpu_kernels)  # the mixed steps' (the layers')
    engine, outputs = run_mixed(tiny_checkpoint)
    assert engine.runner.paged_decode_kernel
    assert outputs == PRE_PAGING_TOKENS
    assert max(calls) > 1  # decode groups of several sequences ran in the kernel


def test_bfloat16_and_other_head_dims_keep_sdpa():
    cpu = torch.device("cpu")
    assert paged_attention.can_decode(cpu, torch.float32, 64)
    assert not paged_attention.can_decode(cpu, torch.bfloat16, 64)
    assert not paged_attention.can_decode(cpu, torch.float32, 72)
    assert not paged_attention.can_decode(torch.device("cuda"), torch.float32, 64)
