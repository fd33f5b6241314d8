"""The Triton paged-attention decode kernel (interpreter on CPU) against the torch gather path."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from engine.models.llama import gather_blocks
from tests.engine.mixed_workload import run_mixed
from tests.engine.test_paged_kv import PRE_PAGING_TOKENS
from tests.triton_aot import assert_compiles_for_sm90

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def torch_decode_attention(q, key_cache, value_cache, block_tables, seq_lens) -> torch.Tensor:
    """The reference: gather each sequence's blocks, mask past its length, SDPA."""
    kv_len = int(seq_lens.max())
    mask = (torch.arange(kv_len, device=q.device)[None, :] < seq_lens[:, None])[:, None, None, :]
    keys, values = gather_blocks(key_cache, block_tables, kv_len), gather_blocks(value_cache, block_tables, kv_len)
    return F.scaled_dot_product_attention(q[:, :, None], keys, values, attn_mask=mask, enable_gqa=True)[:, :, 0]


CASES = {
    "one partition": (4, [1, 15, 16, 17, 33, 64]),  # a 64-position table: one tile, nothing to split
    "partitions merged": (12, [1, 15, 16, 17, 33, 80, 190]),  # several tiles: a small batch splits them
}


BFLOAT16_ON_THE_DEVICE = pytest.param(
    torch.bfloat16,
    id="bfloat16",
    marks=pytest.mark.skipif(DEVICE == "cpu", reason="the interpreter's tl.dot misreads bfloat16 operands (Triton 3.6): CUDA only"),
)


@pytest.mark.parametrize("dtype", [pytest.param(torch.float32, id="float32"), BFLOAT16_ON_THE_DEVICE])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(9, 3), (4, 4), (8, 2)])
def test_kernel_matches_the_gather_path(num_heads, num_kv_heads, case, dtype):
    from engine.models.paged_attention_triton import paged_decode_attention

    generator = torch.Generator().manual_seed(num_heads)
    num_blocks, block_size, head_dim = 40, 16, 64
    table_blocks, lens = CASES[case]
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=generator).to(DEVICE, dtype)
    value_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=generator).to(DEVICE, dtype)
    seq_lens = torch.tensor(lens, device=DEVICE)  # within, at and past block and tile edges
    block_tables = torch.stack([torch.randperm(num_blocks, generator=generator)[:table_blocks] for _ in seq_lens]).to(DEVICE)
    # q as the column view of a merged projection's output that decode steps pass: rows further apart than H * D
    q = torch.randn(len(seq_lens), num_heads + 2 * num_kv_heads, head_dim, generator=generator).to(DEVICE, dtype)[:, :num_heads]
    ours = paged_decode_attention(q, key_cache, value_cache, block_tables, seq_lens)
    # The reference in float32 from the same 16-bit values: the kernel's products are exact and its weights keep ~16 bits.
    expected = torch_decode_attention(q.float(), key_cache.float(), value_cache.float(), block_tables, seq_lens)
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype]  # bfloat16: the output's own rounding (2**-8)
    torch.testing.assert_close(ours.float(), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize(
    ("batch", "num_kv_heads", "tiles", "expected"),
    [(1, 8, 128, 32), (1, 8, 3, 2), (4, 8, 128, 8), (33, 8, 128, 1), (256, 8, 128, 1), (1, 1, 1, 1), (1, 1, 4096, 64)],
)
def test_a_small_batch_splits_its_positions_to_fill_the_device(batch, num_kv_heads, tiles, expected):
    from engine.models.paged_attention_triton import num_splits

    assert num_splits(batch, num_kv_heads, tiles, programs_wanted=264) == expected


def test_engine_with_the_kernel_gives_the_pre_paging_tokens(tiny_checkpoint, monkeypatch):
    from engine.model_runner import ModelRunner
    from engine.models import fused_kernels, llama, paged_attention_triton

    init, kernel = ModelRunner.__init__, paged_attention_triton.paged_decode_attention
    calls = []

    def with_kernel(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.paged_decode_kernel = True

    def counted_kernel(q, *args):
        calls.append(q.shape[0])
        return kernel(q, *args)

    monkeypatch.setattr(ModelRunner, "__init__", with_kernel)
    cpu_with_triton_attention = dataclasses.replace(fused_kernels.for_device_type("cpu"), paged_decode_attention=counted_kernel)
    monkeypatch.setattr(llama, "for_device_type", lambda device_type: cpu_with_triton_attention)  # the Triton kernel on the CPU too
    _, outputs = run_mixed(tiny_checkpoint)
    assert outputs == PRE_PAGING_TOKENS
    assert max(calls) > 1  # decode groups of several sequences ran in the kernel


STRIDES = ["stride_q_seq", "stride_q_head", "stride_cache_block", "stride_cache_pos", "stride_cache_head", "stride_table", "stride_out_seq", "stride_out_head"]
POINTERS = ("q_ptr", "key_ptr", "value_ptr", "out_ptr")
PARTS = {"part_max_ptr": "*fp32", "part_sum_ptr": "*fp32", "part_out_ptr": "*fp32"}


@pytest.mark.parametrize(("dtype", "tile"), [("bf16", 64), ("fp32", 32)])
def test_kernels_compile_for_sm90(dtype: str, tile: int) -> None:
    signature = {name: f"*{dtype}" for name in POINTERS} | PARTS | {"tables_ptr": "*i64", "seq_lens_ptr": "*i64", "scale": "fp32"}
    signature |= {name: "i64" for name in STRIDES} | {"num_splits": "i32", "partition_len": "i32"}
    constexprs = {"GROUP": 4, "GROUP_PAD": 16, "BLOCK_SIZE": 16, "HEAD_DIM": 128, "TILE": tile, "BFLOAT16": dtype == "bf16"}
    assert_compiles_for_sm90("engine.models.paged_attention_triton", "paged_decode_kernel", signature, constexprs)
    merge_signature = PARTS | {"out_ptr": f"*{dtype}", "stride_out_seq": "i64", "stride_out_head": "i64", "num_splits": "i32"}
    assert_compiles_for_sm90("engine.models.paged_attention_triton", "merge_kernel", merge_signature, {"MAX_SPLITS": 64, "HEAD_DIM": 128})
