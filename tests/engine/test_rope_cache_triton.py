"""The Triton rope-and-cache kernel (the interpreter on the CPU) against torch's rotary embedding and
cache writes, bit for bit, and the engine's tokens with it."""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine.mixed_workload import run_mixed
from tests.engine.test_paged_kv import PRE_PAGING_TOKENS
from tests.engine.test_rope_cache import assert_torch_bit_for_bit
from tests.triton_aot import assert_compiles_for_sm90

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16] if DEVICE == "cuda" else [torch.float32]
"""bfloat16 on CUDA only: the interpreter's float32-to-bfloat16 conversion truncates (Triton 3.6), where
the GPU's and torch's round to nearest."""


@settings(max_examples=25, deadline=None)
@given(
    heads=st.sampled_from([(9, 3), (4, 4), (2, 1), (32, 8)]),
    head_dim=st.sampled_from([2, 16, 64, 80, 128]),  # 80: a half (40) that is no power of two
    block_size=st.sampled_from([1, 4, 16]),
    num_tokens=st.integers(1, 24),
    scaling=st.sampled_from([None, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}]),
    magnitude=st.sampled_from([1e-3, 1.0, 1e4]),
    merged=st.booleans(),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 1000),
)
def test_kernel_is_torch_bit_for_bit(heads, head_dim, block_size, num_tokens, scaling, magnitude, merged, dtype, seed):
    from engine.models.rope_cache_triton import rope_and_write_cache

    assert_torch_bit_for_bit(rope_and_write_cache, heads, head_dim, block_size, num_tokens, scaling, magnitude, merged, seed, dtype, DEVICE)


def test_engine_with_the_kernel_gives_the_pre_paging_tokens(tiny_checkpoint, monkeypatch):
    from engine.model_runner import ModelRunner
    from engine.models import fused_kernels, llama, rope_cache_triton

    init, kernel = ModelRunner.__init__, rope_cache_triton.rope_and_write_cache
    calls = []

    def with_kernel(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.rope_kernel = True

    def counted_kernel(q, *args):
        calls.append(q.shape[0])
        return kernel(q, *args)

    monkeypatch.setattr(ModelRunner, "__init__", with_kernel)
    cpu_with_triton_rope = dataclasses.replace(fused_kernels.for_device_type("cpu"), rope_and_write_cache=counted_kernel)
    monkeypatch.setattr(llama, "for_device_type", lambda device_type: cpu_with_triton_rope)  # the Triton kernel on the CPU too
    _, outputs = run_mixed(tiny_checkpoint)
    assert outputs == PRE_PAGING_TOKENS
    assert max(calls) > 1  # steps of several tokens ran in the kernel


def test_kernel_compiles_for_sm90() -> None:
    pointers = ("q_ptr", "k_ptr", "v_ptr", "key_cache_ptr", "value_cache_ptr")
    signature = {name: "*bf16" for name in pointers} | {"cos_ptr": "*fp32", "sin_ptr": "*fp32"}
    signature |= {name: "*i64" for name in ("positions_ptr", "blocks_ptr", "offsets_ptr")}
    strides = ("stride_q_token", "stride_k_token", "stride_v_token", "stride_table", "stride_cache_block", "stride_cache_pos", "num_heads", "num_kv_heads")
    signature |= {name: "i64" for name in strides}
    constexprs = {"HEADS_PAD": 32, "KV_HEADS_PAD": 8, "HALF": 64, "HALF_PAD": 64}
    assert_compiles_for_sm90("engine.models.rope_cache_triton", "rope_cache_kernel", signature, constexprs)
