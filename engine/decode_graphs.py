"""Decode steps replayed from CUDA graphs, one graph per batch-size bucket.

A step whose chunks are all single decode tokens, and no more than the largest bucket, runs the
graph of the smallest bucket that holds it (as vLLM and SGLang do): one launch instead of a few
hundred. Its inputs go into static buffers the graph reads: the token ids (copied on the device,
so async scheduling's ids never visit the host) and one host-built int64 table, one row per
sequence, copied in one transfer:

    inputs: [max_bucket, INPUT_COLUMNS + max_blocks]
            position, cache block, offset in the block, positions attended, then the block table

Rows past the step's sequences are padding: position 0, written to and read from the KV cache's
scratch block (`PagedKVCache.scratch_block`, which no sequence owns), so a padding row never
touches a sequence's keys or values and never changes a real row's result. Columns of the block
table past a row's length keep stale values that the kernel never reads (it stops at the row's
positions attended). The graph's hidden states [bucket, hidden] are sliced to the step's rows.

How a forward becomes replayable is passed in (`GraphCapture`): CUDA graphs on the GPU, or the
forward itself (`eager_capture`), so that the buffers, buckets and padding are tested on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import torch

from engine.kv.kv_cache import PagedKVCache
from engine.models.attention_metadata import AttentionGroup, AttentionMetadata, ScheduledChunk, padded_tables
from engine.models.llama import LlamaForCausalLM
from sampling.device_copy import copy_into

POSITION, BLOCK, OFFSET, SEQ_LEN = range(4)
INPUT_COLUMNS = 4
"""Columns of ``inputs`` before the block table."""

Forward = Callable[[], torch.Tensor]
GraphCapture = Callable[[Forward], Forward]
"""Turns a forward over static buffers into a replay that returns its (static) output."""


def batch_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, then multiples of 8 up to the first at or above ``max_batch``."""
    small = [size for size in (1, 2, 4) if size < max_batch]
    return small + list(range(8, max_batch + 8, 8)) if max_batch > 4 else small + [max_batch]


def eager_capture(forward: Forward) -> Forward:
    """No graph: a replay runs the forward again over the same buffers (the CPU's stand-in)."""
    return forward


def cuda_graph_capture(pool: tuple[int, int]) -> GraphCapture:
    """CUDA graphs sharing one memory ``pool``; each forward runs once on a side stream first
    (Triton compiles, cuBLAS picks its kernels), then is captured."""

    def capture(forward: Forward) -> Forward:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            forward()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            output = forward()

        def replay() -> torch.Tensor:
            graph.replay()
            return output

        return replay

    return capture


class DecodeGraphs:
    """Captured decode forwards of ``model`` over ``kv_cache`` for batches up to ``max_batch``
    sequences of up to ``max_model_len`` positions; `run` replays one for a decode step. ``rope_kernel``:
    the graphs rotate and write the cache in one kernel (`AttentionMetadata.rope_kernel`)."""

    def __init__(
        self, model: LlamaForCausalLM, kv_cache: PagedKVCache, max_batch: int, max_model_len: int, capture: GraphCapture, rope_kernel: bool = False
    ) -> None:
        self.model, self.kv_cache, self.rope_kernel = model, kv_cache, rope_kernel
        self.buckets = batch_buckets(max_batch)
        largest, device = self.buckets[-1], kv_cache.keys[0].device
        max_blocks = -(-max_model_len // kv_cache.block_size)
        self.input_ids = torch.zeros(largest, dtype=torch.int64, device=device)
        self.inputs = self._padding_rows(largest, INPUT_COLUMNS + max_blocks).to(device)
        self.token_index = torch.arange(largest, device=device)[:, None]
        self.unused_mask = torch.ones(largest, 1, 1, 1, dtype=torch.bool, device=device)  # the kernel masks by positions attended
        self.replays = {size: capture(partial(self._forward, size)) for size in reversed(self.buckets)}  # largest first: smaller ones reuse its memory

    def fits(self, chunks: list[ScheduledChunk]) -> bool:
        """Whether a step of these chunks is a decode step a graph can run."""
        return len(chunks) <= self.buckets[-1] and all(chunk.num_tokens == 1 for chunk in chunks)

    def bucket(self, batch: int) -> int:
        return next(size for size in self.buckets if size >= batch)

    def run(self, input_ids: torch.Tensor, chunks: list[ScheduledChunk]) -> torch.Tensor:
        """input_ids: [B] on the device, one per chunk -> final-normed hidden states [B, hidden]."""
        batch = len(chunks)
        size = self.bucket(batch)
        host = self._host_inputs(chunks, size)
        copy_into(self.inputs[:size, : host.shape[1]], host)
        self.input_ids[:batch].copy_(input_ids)
        return self.replays[size]()[:batch]

    def _forward(self, size: int) -> torch.Tensor:
        inputs = self.inputs[:size]
        group = AttentionGroup(self.token_index[:size], inputs[:, INPUT_COLUMNS:], self.unused_mask[:size], inputs[:, SEQ_LEN])
        meta = AttentionMetadata(
            blocks=inputs[:, BLOCK], offsets=inputs[:, OFFSET], positions=inputs[:, POSITION], groups=[group], decode_kernel=True, rope_kernel=self.rope_kernel
        )
        return self.model(self.input_ids[:size], meta, self.kv_cache.keys, self.kv_cache.values)

    def _host_inputs(self, chunks: list[ScheduledChunk], size: int) -> torch.Tensor:
        """[size, INPUT_COLUMNS + widest table]: the chunks' rows, then padding rows."""
        block_size = self.kv_cache.block_size
        tables = [chunk.block_ids[: chunk.position // block_size + 1] for chunk in chunks]
        width = max(len(table) for table in tables)
        inputs = self._padding_rows(size, INPUT_COLUMNS + width)
        rows = inputs.numpy()[: len(chunks)]
        rows[:, INPUT_COLUMNS:] = padded_tables(tables, width, pad=self.kv_cache.scratch_block)
        positions = np.array([chunk.position for chunk in chunks], dtype=np.int64)
        rows[:, POSITION], rows[:, OFFSET], rows[:, SEQ_LEN] = positions, positions % block_size, positions + 1
        rows[:, BLOCK] = [table[-1] for table in tables]
        return inputs

    def _padding_rows(self, size: int, columns: int) -> torch.Tensor:
        rows = torch.full((size, columns), self.kv_cache.scratch_block, dtype=torch.int64)
        rows[:, POSITION], rows[:, OFFSET], rows[:, SEQ_LEN] = 0, 0, 1
        return rows
