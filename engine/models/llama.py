"""The Llama-family decoder (Llama, Mistral, Qwen2, SmolLM2) over a flat token batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelConfig
from engine.kernels import rms_norm
from engine.models.attention_metadata import AttentionGroup, AttentionMetadata
from engine.models.fused_kernels import for_device_type
from engine.models.merged_linear import MergedLinear
from engine.models.prompt_tiles import MatmulRows, PromptTiles, can_mlp_in_tiles, mlp_in_tiles
from engine.models.quant_linear import MergedQuantLinear, QuantizedWeight, QuantLinear, merged
from engine.models.rope import RotaryEmbedding

ARGMAX_VOCAB_CHUNK = 4096
"""Vocabulary rows per matmul in `LlamaForCausalLM.argmax_logits`: [N, 4096] float32 logits stay in cache."""


class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * weight over the last dimension, by torch's fused ``rms_norm``
    (bit for bit the float32 formula written out in ops, at a third of the time for one token:
    tests/engine/test_llama_layers.py), or by the C++ kernel where ``kernel`` is set (float32 on
    the CPU: `engine.kernels.rms_norm`, the same bits in one call)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.kernel = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, hidden] -> [T, hidden]."""
        if self.kernel:
            return rms_norm.rms_norm(x, self.weight, self.eps)
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)

    def add_and_norm(self, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x, delta: [T, hidden] -> (x + delta, this norm of it): in one kernel where the device has
        one (`engine.models.fused_kernels`: Triton's on CUDA), else the add and then `forward`."""
        if fused := for_device_type(x.device.type).add_rms_norm:
            return fused(x, delta, self.weight, self.eps)
        total = x + delta
        return total, self(total)


def use_rms_norm_kernel(model: nn.Module) -> None:
    """Set every `RMSNorm` of ``model`` to run through the C++ kernel."""
    for module in model.modules():
        if isinstance(module, RMSNorm):
            module.kernel = True


def merge_projections(layers: nn.ModuleList, dense: bool = False) -> int:
    """Where a layer's q, k and v (and its gate and up) projections are all computed from quantized
    blocks of one format, compute each group in one matmul (`MergedQuantLinear`, the same bits) and
    drop the separate linears; ``dense``: dense linears too (`MergedLinear`). Returns how many groups were merged."""

    def merge(linears: list[nn.Module]) -> MergedQuantLinear | MergedLinear | None:
        quantized = merged(linears)
        return MergedLinear.of(linears) if quantized is None and dense else quantized

    count = 0
    for layer in layers:
        attention, mlp = layer.self_attn, layer.mlp
        qkv = merge([attention.q_proj, attention.k_proj, attention.v_proj])
        if qkv is not None:
            attention.qkv_proj = qkv
            del attention.q_proj, attention.k_proj, attention.v_proj
            count += 1
        gate_up = merge([mlp.gate_proj, mlp.up_proj])
        if gate_up is not None:
            mlp.gate_up_proj = gate_up
            del mlp.gate_proj, mlp.up_proj
            count += 1
    return count


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)
        self.qkv_proj: MergedQuantLinear | MergedLinear | None = None
        """q, k and v in one matmul, in place of the three (`merge_projections`)."""

    def project(self, x: torch.Tensor, rows: MatmulRows | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [T, hidden] -> q [T, H * D], k and v [T, KVH * D]."""
        if self.qkv_proj is not None:
            return linear(self.qkv_proj, x, rows)
        return linear(self.q_proj, x, rows), linear(self.k_proj, x, rows), linear(self.v_proj, x, rows)

    def forward(
        self,
        x: torch.Tensor,
        rope: RotaryEmbedding,
        meta: AttentionMetadata,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
    ) -> torch.Tensor:
        """x: [T, hidden] -> [T, hidden]; writes this batch's keys and values into the cache."""
        num_tokens = x.shape[0]
        q, k, v = self.project(x, meta.matmul_rows)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        q = rotate_and_write_cache(q, k, v, rope, meta, key_cache, value_cache)
        if meta.decode_kernel_only:
            return linear(self.o_proj, decode_attention(q, key_cache, value_cache, meta.groups[0]).view(num_tokens, -1), meta.matmul_rows)
        # Row num_tokens is scratch: padded queries read it and write their output there.
        q_padded = torch.cat([q, q.new_zeros(1, self.num_heads, self.head_dim)])
        out = q.new_empty(num_tokens + 1, self.num_heads, self.head_dim)
        for group in meta.groups:
            if meta.decode_kernel and group.token_index.shape[1] == 1:
                rows = group.token_index[:, 0]
                out[rows] = decode_attention(q[rows], key_cache, value_cache, group)
                continue
            queries = q_padded[group.token_index].transpose(1, 2)  # [B, H, Q, D]
            out[group.token_index] = gather_attention(queries, key_cache, value_cache, group).transpose(1, 2)
        return linear(self.o_proj, out[:num_tokens].reshape(num_tokens, -1), meta.matmul_rows)


def rotate_and_write_cache(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: RotaryEmbedding, meta: AttentionMetadata, key_cache: torch.Tensor, value_cache: torch.Tensor
) -> torch.Tensor:
    """q: [T, H, D], k, v: [T, KVH, D] -> rotated q; the rotated keys and the values written into
    the caches at ``meta``'s slots: in one kernel call where ``meta.rope_kernel`` says so (the same
    bits), else by torch's operations."""
    if meta.rope_kernel:  # q, k and v may be column views of one merged projection: the kernels take their row strides
        fused = for_device_type(q.device.type).rope_and_write_cache
        fused(q, k, v, rope.cos, rope.sin, meta.positions, meta.blocks, meta.offsets, key_cache, value_cache)
        return q
    q, k = rope(q, k, meta.positions)
    key_cache[meta.blocks, meta.offsets] = k
    value_cache[meta.blocks, meta.offsets] = v
    return q


def gather_attention(queries: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, group: AttentionGroup) -> torch.Tensor:
    """queries: [B, H, Q, D] of a group -> [B, H, Q, D]: its sequences' blocks gathered, masked, SDPA."""
    keys = gather_blocks(key_cache, group.block_tables, group.kv_len)
    values = gather_blocks(value_cache, group.block_tables, group.kv_len)
    return F.scaled_dot_product_attention(queries, keys, values, attn_mask=group.mask, enable_gqa=True)


def decode_attention(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, group: AttentionGroup) -> torch.Tensor:
    """q: [B, H, D], one query per sequence of a decode group -> [B, H, D], by the device's
    paged-attention kernel (`engine.models.fused_kernels`: C++ in float32 on the CPU, Triton on CUDA)."""
    return for_device_type(q.device.type).paged_decode_attention(q, key_cache, value_cache, group.block_tables, group.seq_lens)


def gather_blocks(cache: torch.Tensor, block_tables: torch.Tensor, kv_len: int) -> torch.Tensor:
    """cache: [num_blocks, block_size, KVH, D], block_tables: [B, N] -> [B, KVH, kv_len, D] (a strided
    view of one copy), each sequence's positions in order (kv_len <= N * block_size)."""
    batch, num_blocks = block_tables.shape
    _, block_size, num_kv_heads, head_dim = cache.shape
    blocks = cache.index_select(0, block_tables.flatten()).view(batch, num_blocks * block_size, num_kv_heads, head_dim)
    return blocks[:, :kv_len].transpose(1, 2)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.gate_up_proj: MergedQuantLinear | MergedLinear | None = None
        """gate and up in one matmul, in place of the two (`merge_projections`)."""

    def forward(self, x: torch.Tensor, rows: MatmulRows | None = None) -> torch.Tensor:
        """x: [T, hidden] -> [T, hidden]; ``rows``: as `linear` takes them. Where the gate/up and down
        projections have bfloat16 tiles, the rows they name go through both in bfloat16 (`mlp_in_tiles`)."""
        tiles = self.prompt_tiles() if rows is not None else None
        if rows is None or tiles is None:
            return self._mlp(x, rows)
        gate_up, down = tiles

        def compute(part: torch.Tensor, in_tiles: bool, out: torch.Tensor | None) -> torch.Tensor:
            return mlp_in_tiles(gate_up, down, part, out) if in_tiles else self._mlp(part)

        return rows.compute(x, down.out_features, compute)

    def _mlp(self, x: torch.Tensor, rows: MatmulRows | None = None) -> torch.Tensor:
        """down(silu(gate) * up), each projection as `linear` computes it."""
        if self.gate_up_proj is not None:
            gate, up = linear(self.gate_up_proj, x, rows)
        else:
            gate, up = linear(self.gate_proj, x, rows), linear(self.up_proj, x, rows)
        return linear(self.down_proj, silu_mul(gate, up), rows)

    def prompt_tiles(self) -> tuple[PromptTiles, PromptTiles] | None:
        """The merged gate/up projection's tiles and the down projection's, where both have them and
        `mlp_in_tiles` can take them."""
        gate_up, down = self.gate_up_proj, self.down_proj
        if not isinstance(gate_up, QuantLinear) or not isinstance(down, QuantLinear) or gate_up.prompt_tiles is None or down.prompt_tiles is None:
            return None
        return (gate_up.prompt_tiles, down.prompt_tiles) if can_mlp_in_tiles(down.in_features) else None


def linear(module: nn.Module, x: torch.Tensor, rows: MatmulRows | None) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """``module(x)`` (a merged linear's: one output per projection); a `QuantLinear` also takes the
    step's ``rows`` (which of them its bfloat16 tiles compute)."""
    return module(x, rows) if rows is not None and isinstance(module, QuantLinear) else module(x)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate, up: [T, I] -> silu(gate) * up: in one kernel where the device has one (`engine.models.fused_kernels`: Triton's on CUDA), else torch's two."""
    if fused := for_device_type(gate.device.type).silu_mul:
        return fused(gate, up)
    return F.silu(gate) * up


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)


class LlamaForCausalLM(nn.Module):
    """forward: flat token batch -> hidden states; compute_logits: hidden rows -> logits."""

    def __init__(self, config: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rope = RotaryEmbedding(config, max_positions)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.head_blocks: QuantizedWeight | None = None
        """The output weight's quantized blocks, when the model computes its logits through them (`engine.models.quant_linear`)."""

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        meta: AttentionMetadata,
        key_caches: list[torch.Tensor],
        value_caches: list[torch.Tensor],
    ) -> torch.Tensor:
        """input_ids: [T] -> final-normed hidden states [T, hidden]."""
        hidden = self.embed_tokens(input_ids)
        normed = self.layers[0].input_layernorm(hidden)
        next_norms = [layer.input_layernorm for layer in self.layers[1:]] + [self.norm]
        for layer, next_norm, key_cache, value_cache in zip(self.layers, next_norms, key_caches, value_caches):
            hidden, normed = layer.post_attention_layernorm.add_and_norm(hidden, layer.self_attn(normed, self.rope, meta, key_cache, value_cache))
            hidden, normed = next_norm.add_and_norm(hidden, layer.mlp(normed, meta.matmul_rows))
        return normed

    @property
    def output_weight(self) -> torch.Tensor:
        """[vocab, hidden]: the lm_head's, or the embedding's when tied."""
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [N, hidden] (only the rows to sample) -> float32 logits [N, vocab]."""
        return self.head_logits(hidden, 0, self.config.vocab_size).float()

    def head_logits(self, hidden: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """hidden: [N, hidden] -> logits of vocabulary rows ``start:end`` [N, end - start], in the model's dtype."""
        if self.head_blocks is not None:
            return self.head_blocks.rows(start, end).matmul(hidden)
        return F.linear(hidden, self.output_weight[start:end])

    @torch.inference_mode()
    def argmax_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [N, hidden] -> [N] int64, ``compute_logits(hidden).max(-1).indices`` (the first
        maximum) without the [N, vocab] logits: on the CPU, writing them out and reading them back
        costs more than the matmul, so a quantized head takes it in its kernel, and another goes
        ``ARGMAX_VOCAB_CHUNK`` vocabulary rows at a time."""
        if self.head_blocks is not None:
            return self.head_blocks.argmax(hidden)
        vocab = self.config.vocab_size
        best_values, best_ids = self.head_logits(hidden, 0, ARGMAX_VOCAB_CHUNK).float().max(dim=-1)
        for start in range(ARGMAX_VOCAB_CHUNK, vocab, ARGMAX_VOCAB_CHUNK):
            values, ids = self.head_logits(hidden, start, min(start + ARGMAX_VOCAB_CHUNK, vocab)).float().max(dim=-1)
            better = values > best_values  # strictly: an earlier chunk keeps a tie
            best_values = torch.where(better, values, best_values)
            best_ids = torch.where(better, ids + start, best_ids)
        return best_ids

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Copy HF-named weights in; every parameter must be present and no name unknown."""
        params = dict(self.named_parameters())
        unknown = sorted(set(weights) - set(params) - {"lm_head.weight"})
        missing = sorted(set(params) - set(weights))
        if unknown or missing:
            raise ValueError(f"checkpoint mismatch: missing {missing[:5]}, unexpected {unknown[:5]}")
        with torch.no_grad():
            for name, param in params.items():
                if weights[name].shape != param.shape:
                    raise ValueError(f"{name}: checkpoint shape {tuple(weights[name].shape)} != model {tuple(param.shape)}")
                param.copy_(weights[name])
