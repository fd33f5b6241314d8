"""Decode steps through the CPU's kernels, layer after layer from a flat list of weights.

`LlamaForCausalLM.forward` runs each layer as modules: on the CPU in float32 with a GGUF's blocks,
a decode step's work is C++ kernels (`engine.kernels`: quantized matmuls, RMS norm, rope-and-cache,
paged attention) and at one token a step about 85 µs a layer went to calling them through the
modules (``nn.Module`` calls and attribute lookups, output splits, small wrappers). `CpuDecode` runs
the same kernels, in the same order, on the same tensors from each layer's `DecodeLayer`: the same
bits (tests/engine/test_cpu_decode.py), about 1.7 ms less a step at batch 1 of the default model
(interleaved in one process: median 12.3 against 14.0 ms; docs/engine.md). It takes only decode steps
(one token per sequence, one attention group); any other step runs the modules.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kernels import paged_attention, rms_norm, rope_cache
from engine.models.attention_metadata import AttentionMetadata
from engine.models.llama import LlamaForCausalLM, silu_mul
from engine.models.quant_linear import MergedQuantLinear, QuantizedWeight, QuantLinear


@dataclass(frozen=True)
class DecodeLayer:
    """One decoder layer's weights as its decode step reads them (the modules' own tensors)."""

    input_norm: torch.Tensor
    qkv: QuantizedWeight
    qkv_bias: torch.Tensor | None
    q_size: int
    kv_size: int
    o: QuantizedWeight
    post_norm: torch.Tensor
    gate_up: QuantizedWeight
    intermediate_size: int
    down: QuantizedWeight


class CpuDecode:
    """``__call__(input_ids, meta, key_caches, value_caches)``: `LlamaForCausalLM.forward` for a decode step (`fits`)."""

    def __init__(self, model: LlamaForCausalLM, layers: list[DecodeLayer]) -> None:
        self.model = model
        self.layers = layers
        config = model.config
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.eps = model.norm.eps

    @classmethod
    def of(cls, model: LlamaForCausalLM) -> CpuDecode | None:
        """The model's decode steps through its kernels, or None unless every layer has them: merged
        quantized projections (q, k and v; gate and up; no bias on o, gate, up or down) and kernel norms of one epsilon."""
        layers = []
        for layer in model.layers:
            attention, mlp = layer.self_attn, layer.mlp
            merged = (attention.qkv_proj, mlp.gate_up_proj)
            single = (attention.o_proj, mlp.down_proj)
            if not all(isinstance(m, MergedQuantLinear) for m in merged) or not all(type(m) is QuantLinear and m.bias is None for m in single):
                return None
            norms = (layer.input_layernorm, layer.post_attention_layernorm)
            if mlp.gate_up_proj.bias is not None or not all(norm.kernel and norm.eps == model.norm.eps for norm in norms):
                return None
            q_size, kv_size, _ = attention.qkv_proj.split_sizes
            layers.append(
                DecodeLayer(
                    layer.input_layernorm.weight,
                    attention.qkv_proj.weight_blocks,
                    attention.qkv_proj.bias,
                    q_size,
                    kv_size,
                    attention.o_proj.weight_blocks,
                    layer.post_attention_layernorm.weight,
                    mlp.gate_up_proj.weight_blocks,
                    mlp.gate_up_proj.split_sizes[0],
                    mlp.down_proj.weight_blocks,
                )
            )
        return cls(model, layers) if model.norm.kernel else None

    @staticmethod
    def fits(meta: AttentionMetadata) -> bool:
        """Whether the step is one the modules would run through the decode kernels: one token per sequence, one group."""
        return meta.decode_kernel_only and meta.rope_kernel

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, meta: AttentionMetadata, key_caches: list[torch.Tensor], value_caches: list[torch.Tensor]) -> torch.Tensor:
        """input_ids: [B] -> final-normed hidden states [B, hidden]; writes the step's keys and values into the caches."""
        model, group, eps = self.model, meta.groups[0], self.eps
        cos, sin = model.rope.cos, model.rope.sin
        hidden = model.embed_tokens(input_ids)
        num_tokens = hidden.shape[0]
        for layer, key_cache, value_cache in zip(self.layers, key_caches, value_caches):
            qkv = layer.qkv.matmul(rms_norm.rms_norm(hidden, layer.input_norm, eps))
            if layer.qkv_bias is not None:
                qkv = qkv + layer.qkv_bias
            q_end, k_end = layer.q_size, layer.q_size + layer.kv_size
            q = qkv[:, :q_end].view(num_tokens, self.num_heads, self.head_dim)
            k = qkv[:, q_end:k_end].view(num_tokens, self.num_kv_heads, self.head_dim)
            v = qkv[:, k_end:].view(num_tokens, self.num_kv_heads, self.head_dim)
            rope_cache.rope_and_write_cache(q, k, v, cos, sin, meta.positions, meta.blocks, meta.offsets, key_cache, value_cache)
            attended = paged_attention.paged_decode_attention(q, key_cache, value_cache, group.block_tables, group.seq_lens)
            hidden = hidden + layer.o.matmul(attended.view(num_tokens, -1))
            gate_up = layer.gate_up.matmul(rms_norm.rms_norm(hidden, layer.post_norm, eps))
            hidden = hidden + layer.down.matmul(silu_mul(gate_up[:, : layer.intermediate_size], gate_up[:, layer.intermediate_size :]))
        return rms_norm.rms_norm(hidden, model.norm.weight, eps)
