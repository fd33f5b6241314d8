"""The Triton paged-attention decode kernel (interpreter on CPU) against the torch gather path."""

from __future__ import annotations

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


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(9, 3), (4, 4), (8, 2)])
def test_kernel_matches_the_gather_path(num_heads, num_kv_heads):
    from engine.models.paged_attention_triton import paged_decode_attention

    generator = torch.Generator().manual_seed(num_heads)
    num_blocks, block_size, head_dim = 40, 16, 64
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=generator).to(DEVICE)
    value_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=generator).to(DEVICE)
    seq_lens = torch.tensor([1, 15, 16, 17, 33, 80], device=DEVICE)  # within, at and past block edges
    block_tables = torch.stack([torch.randperm(num_blocks, generator=generator)[:5] for _ in seq_lens]).to(DEVICE)
    q = torch.randn(len(seq_lens), num_heads, head_dim, generator=generator).to(DEVICE)
    ours = paged_decode_attention(q, key_cache, value_cache, block_tables, seq_lens)
    torch.testing.assert_close(ours, torch_decode_attention(q, key_cache, value_cache, block_tables, seq_lens), atol=1e-5, rtol=1e-5)


def test_engine_with_the_kernel_gives_the_pre_paging_tokens(tiny_checkpoint, monkeypatch):
    from engine.model_runner import ModelRunner
    from engine.models import llama, paged_attention_triton

    init, kernel = ModelRunner.__init__, paged_attention_triton.paged_decode_attention
    calls = []

    def with_kernel(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.paged_decode_kernel = True

    def counted_kernel(q, *args):
        calls.append(q.shape[0])
        return kernel(q, *args)

    monkeypatch.setattr(ModelRunner, "__init__", with_kernel)
    monkeypatch.setattr(llama, "decode_attention", llama.triton_decode_attention)  # the Triton kernel on the CPU too
    monkeypatch.setattr(paged_attention_triton, "paged_decode_attention", counted_kernel)
    _, outputs = run_mixed(tiny_checkpoint)
    assert outputs == PRE_PAGING_TOKENS
    assert max(calls) > 1  # decode groups of several sequences ran in the kernel


STRIDES = ["stride_q_seq", "stride_q_head", "stride_cache_block", "stride_cache_pos", "stride_cache_head", "stride_table", "stride_out_seq", "stride_out_head"]
SIGNATURE = {"q_ptr": "*bf16", "key_ptr": "*bf16", "value_ptr": "*bf16", "tables_ptr": "*i64", "seq_lens_ptr": "*i64", "out_ptr": "*bf16", "scale": "fp32"}


def test_kernel_compiles_for_sm90() -> None:
    constexprs = {"GROUP": 3, "GROUP_PAD": 4, "BLOCK_SIZE": 16, "HEAD_DIM": 64}
    signature = SIGNATURE | {name: "i64" for name in STRIDES}
    assert_compiles_for_sm90("engine.models.paged_attention_triton", "paged_decode_kernel", signature, constexprs)
