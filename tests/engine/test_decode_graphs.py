"""Decode graphs' buckets, padding and replay bookkeeping: with CUDA graphs on a GPU, and on the CPU
with `eager_capture` standing in for them (decode attention then runs in the C++ kernel,
`engine.kernels.paged_attention`). `make gpu-check` also compares greedy tokens with and without graphs on a GPU."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.decode_graphs import DecodeGraphs, GraphCapture, batch_buckets, cuda_graph_capture, eager_capture
from engine.kv.kv_cache import PagedKVCache
from engine.model_runner import ModelRunner
from engine.models.attention_metadata import ScheduledChunk, build_attention_metadata
from engine.models.llama import LlamaForCausalLM
from tests.engine.mixed_workload import run_mixed
from tests.engine.test_paged_kv import PRE_PAGING_TOKENS

BLOCK_SIZE = 4
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def capture() -> GraphCapture:
    return cuda_graph_capture(torch.cuda.graph_pool_handle()) if DEVICE.type == "cuda" else eager_capture


@given(st.integers(1, 600))
def test_buckets_hold_every_batch_up_to_the_largest(max_batch):
    buckets = batch_buckets(max_batch)
    assert buckets == sorted(set(buckets)) and buckets[0] == 1
    assert max_batch <= buckets[-1] < max_batch + 8
    assert all(later - earlier <= 8 for earlier, later in zip(buckets, buckets[1:]))


@pytest.fixture(scope="module")
def model_and_cache(tiny_checkpoint):
    model = LlamaForCausalLM(tiny_checkpoint.config, max_positions=64)
    model.load_weights(tiny_checkpoint.weights)
    cache = PagedKVCache(tiny_checkpoint.config, num_blocks=48, block_size=BLOCK_SIZE, dtype=torch.float32, device=DEVICE)
    generator = torch.Generator().manual_seed(3)
    for tensor in (*cache.keys, *cache.values):
        tensor.copy_(torch.randn(tensor.shape, generator=generator))
    return model.to(DEVICE).eval(), cache


def decode_chunks(lengths: list[int], first_block: int) -> list[ScheduledChunk]:
    """One decode token per sequence, at position ``length - 1``, over consecutive blocks from ``first_block``."""
    chunks, block = [], first_block
    for length in lengths:
        count = -(-length // BLOCK_SIZE)
        chunks.append(ScheduledChunk(tuple(range(block, block + count)), length - 1, 1))
        block += count
    return chunks


def eager_hidden(model, cache, input_ids, chunks):
    meta = build_attention_metadata(chunks, BLOCK_SIZE, DEVICE, decode_kernel=True)
    return model(input_ids, meta, cache.keys, cache.values)


def snapshot(cache: PagedKVCache) -> list[torch.Tensor]:
    return [tensor.clone() for tensor in (*cache.keys, *cache.values)]


def test_padded_replay_equals_the_eager_step_and_touches_only_its_own_slots(model_and_cache):
    model, cache = model_and_cache
    graphs = DecodeGraphs(model, cache, max_batch=12, max_model_len=40, capture=capture())
    assert graphs.buckets == [1, 2, 4, 8, 16]
    # A wide step first, so the narrower one's padding rows hold stale rows of real sequences.
    for lengths, first_block in (([9, 17, 4, 30, 12, 8, 21, 5, 16, 3], 0), ([13, 6, 25], 1)):
        chunks = decode_chunks(lengths, first_block)
        input_ids = torch.tensor([100 + 7 * index for index in range(len(chunks))], device=DEVICE)
        before = snapshot(cache)
        expected = eager_hidden(model, cache, input_ids, chunks)
        eager_writes = snapshot(cache)
        for tensor, saved in zip((*cache.keys, *cache.values), before):
            tensor.copy_(saved)
        replayed = graphs.run(input_ids, chunks)
        assert replayed.shape == expected.shape
        torch.testing.assert_close(replayed, expected, rtol=1e-5, atol=1e-5)
        after = snapshot(cache)
        for tensor_before, tensor_eager, tensor_after in zip(before, eager_writes, after):
            real = slice(0, cache.num_blocks)  # padding rows may write the scratch block alone
            assert torch.equal(written_slots(tensor_before[real], tensor_after[real]), written_slots(tensor_before[real], tensor_eager[real]))
            torch.testing.assert_close(tensor_after[real], tensor_eager[real], rtol=1e-5, atol=1e-5)


def written_slots(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """[blocks, block_size] bool: the cache slots whose keys or values changed."""
    return (before != after).flatten(2).any(-1)


def test_steps_that_are_not_plain_decodes_stay_eager(model_and_cache):
    model, cache = model_and_cache
    graphs = DecodeGraphs(model, cache, max_batch=4, max_model_len=40, capture=eager_capture)
    assert graphs.fits(decode_chunks([5, 9, 3, 7], 0))
    assert not graphs.fits(decode_chunks([5, 9, 3, 7, 2], 0))  # over the largest bucket
    assert not graphs.fits([ScheduledChunk((0, 1), 3, 2)])  # a prefill chunk or verified drafts


def test_engine_with_decode_graphs_gives_the_pre_paging_tokens(tiny_checkpoint, monkeypatch):
    """The mixed workload (decodes, prefill chunks, verified drafts, guidance, a seeded draw) with
    decode steps replayed from the graphs (on CUDA by default; on the CPU through their buffers with
    eager capture): the same tokens as without them."""
    init, run = ModelRunner.__init__, DecodeGraphs.run
    batches = []

    def with_eager_graphs(self, checkpoint, config: EngineConfig, *args, **kwargs):
        init(self, checkpoint, config, *args, **kwargs)
        self.paged_decode_kernel = True
        self.decode_graphs = DecodeGraphs(self.model, self.kv_cache, config.max_num_seqs, config.max_model_len, eager_capture)

    def counted_run(self, input_ids, chunks):
        batches.append(len(chunks))
        return run(self, input_ids, chunks)

    if DEVICE.type == "cpu":
        monkeypatch.setattr(ModelRunner, "__init__", with_eager_graphs)
    monkeypatch.setattr(DecodeGraphs, "run", counted_run)
    _, outputs = run_mixed(tiny_checkpoint)
    assert outputs == PRE_PAGING_TOKENS
    assert len(batches) > 10 and any(batch not in (1, 2, 4, 8) for batch in batches)  # decode steps replayed, some padded
