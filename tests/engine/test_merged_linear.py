"""Dense projections merged into one matmul (`MergedLinear`, what a CUDA engine runs): each output is
its own linear's, and a model with its projections merged computes the same hidden states."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.loader.checkpoint import Checkpoint
from engine.models.attention_metadata import ScheduledChunk, build_attention_metadata
from engine.models.llama import LlamaForCausalLM, merge_projections
from engine.models.merged_linear import MergedLinear


@pytest.mark.parametrize("bias", [False, True])
def test_each_output_is_its_own_linears(bias: bool) -> None:
    torch.manual_seed(0)
    linears = [nn.Linear(32, size, bias=bias) for size in (48, 16, 16)]
    x = torch.randn(5, 32)
    outputs = MergedLinear.of(linears)(x)
    assert [o.shape for o in outputs] == [(5, 48), (5, 16), (5, 16)]
    for output, linear in zip(outputs, linears):
        torch.testing.assert_close(output, linear(x), rtol=1e-6, atol=1e-6)


def test_linears_of_mixed_biases_or_kinds_are_not_merged() -> None:
    assert MergedLinear.of([nn.Linear(8, 8, bias=True), nn.Linear(8, 8, bias=False)]) is None
    assert MergedLinear.of([nn.Linear(8, 8), nn.Identity()]) is None


def test_a_merged_model_computes_the_same_hidden_states(tiny_checkpoint: Checkpoint) -> None:
    def model() -> LlamaForCausalLM:
        built = LlamaForCausalLM(tiny_checkpoint.config, max_positions=64).eval()
        built.load_weights(tiny_checkpoint.weights)
        return built

    plain, merged = model(), model()
    assert merge_projections(merged.layers, dense=True) == 2 * len(merged.layers)
    assert merged.layers[0].self_attn.qkv_proj is not None and not hasattr(merged.layers[0].self_attn, "q_proj")
    chunk = ScheduledChunk(block_ids=(1,), position=0, num_tokens=6)
    input_ids = torch.tensor([5, 6, 7, 8, 9, 10])
    hidden = []
    for each in (plain, merged):
        meta = build_attention_metadata([chunk], block_size=16, device=torch.device("cpu"))
        caches = [torch.zeros(4, 16, tiny_checkpoint.config.num_kv_heads, tiny_checkpoint.config.head_dim) for _ in range(2 * len(each.layers))]
        hidden.append(each(input_ids, meta, caches[::2], caches[1::2]))
    torch.testing.assert_close(hidden[1], hidden[0], rtol=1e-5, atol=1e-5)
