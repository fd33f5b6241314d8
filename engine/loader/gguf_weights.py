"""Read a GGUF file: metadata, model config, dequantized weights under HF-style names, and the
quantized blocks of its Q4_0/Q4_1/Q8_0 matrices (`engine.loader.gguf_blocks`)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from engine.config import ModelConfig
from engine.loader.gguf_blocks import quantized_weight
from engine.loader.model_files import read_metadata
from engine.models.quant_linear import QuantizedWeight

logger = logging.getLogger(__name__)

SUPPORTED_TYPES = {
    GGMLQuantizationType.F32,
    GGMLQuantizationType.F16,
    GGMLQuantizationType.BF16,
    GGMLQuantizationType.Q8_0,
    GGMLQuantizationType.Q4_0,
    GGMLQuantizationType.Q4_1,
}
SUPPORTED_ARCHITECTURES = ("llama", "qwen2")

# GGUF tensor name (after "blk.N.") -> HF-style name (after "layers.N.").
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "embed_tokens.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight",
}


class UnsupportedGGUFError(ValueError):
    """The GGUF file uses an architecture or tensor type this loader does not read."""


def config_from_metadata(meta: dict[str, object]) -> ModelConfig:
    arch = str(meta["general.architecture"])
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedGGUFError(f"GGUF architecture {arch!r} is not supported (supported: {SUPPORTED_ARCHITECTURES})")
    hidden = int(meta[f"{arch}.embedding_length"])
    num_heads = int(meta[f"{arch}.attention.head_count"])
    vocab = meta.get(f"{arch}.vocab_size") or len(meta["tokenizer.ggml.tokens"])  # type: ignore[arg-type]
    return ModelConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(meta[f"{arch}.feed_forward_length"]),
        num_layers=int(meta[f"{arch}.block_count"]),
        num_heads=num_heads,
        num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv", num_heads)),
        head_dim=int(meta.get(f"{arch}.rope.dimension_count", hidden // num_heads)),
        rms_norm_eps=float(meta[f"{arch}.attention.layer_norm_rms_epsilon"]),
        rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        max_position_embeddings=int(meta[f"{arch}.context_length"]),
        tie_word_embeddings=False,  # decided from the tensors present, see `load_gguf_checkpoint`
        attention_bias=arch == "qwen2",
        rope_scaling=_rope_scaling(meta, arch),
    )


def _rope_scaling(meta: dict[str, object], arch: str) -> dict[str, object] | None:
    kind = meta.get(f"{arch}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    scaling: dict[str, object] = {"rope_type": kind, "factor": float(meta[f"{arch}.rope.scaling.factor"])}  # type: ignore[arg-type]
    original = meta.get(f"{arch}.rope.scaling.original_context_length")
    if original is not None:
        scaling["original_max_position_embeddings"] = int(original)  # type: ignore[arg-type]
    return scaling


def unpermute_rope_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's interleaving of q/k projection rows, back to HF's half-split rope layout.

    weight: [num_heads * head_dim, in] (a bias is [num_heads * head_dim]).
    """
    rows = weight.shape[0]
    head_dim = rows // num_heads
    trailing = weight.shape[1:]
    return weight.reshape(num_heads, head_dim // 2, 2, *trailing).swapaxes(1, 2).reshape(rows, *trailing)


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    if gguf_name.startswith("blk."):
        _, layer, rest = gguf_name.split(".", 2)
        if rest in _LAYER_NAMES:
            return f"layers.{layer}.{_LAYER_NAMES[rest]}"
    return None


class GGUFContents(NamedTuple):
    """What `load_gguf_checkpoint` reads from a GGUF file."""

    config: ModelConfig
    metadata: dict[str, object]
    weights: dict[str, torch.Tensor]
    """float32, under HF names, in HF's rope layout."""
    quantized: dict[str, QuantizedWeight]
    """The blocks of its 4-bit and 8-bit matrices (the same names and row order) that a model may compute with."""


def load_gguf_checkpoint(path: Path) -> GGUFContents:
    """Config, metadata, float32 weights (HF names, HF rope layout) of a GGUF file, and the blocks
    of its 4-bit and 8-bit matrices (the same names and row order) that a model may compute with."""
    reader = GGUFReader(path)
    meta = read_metadata(reader)
    config = config_from_metadata(meta)
    weights: dict[str, torch.Tensor] = {}
    quantized: dict[str, QuantizedWeight] = {}
    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        if name is None:
            logger.debug("skipping GGUF tensor %s", tensor.name)
            continue
        if tensor.tensor_type not in SUPPORTED_TYPES:
            raise UnsupportedGGUFError(f"tensor {tensor.name} has unsupported type {tensor.tensor_type.name}")
        array = np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)  # a writable copy of the mmap
        value = torch.from_numpy(array)
        blocks = quantized_weight(tensor)
        heads = config.num_heads if ".q_proj." in name else config.num_kv_heads if ".k_proj." in name else None
        if heads is not None:
            value = unpermute_rope_rows(value, heads)
            blocks = None if blocks is None else blocks.permute_rows(lambda rows, heads=heads: unpermute_rope_rows(rows, heads))
        weights[name] = value
        if blocks is not None:
            quantized[name] = blocks
    tied = "lm_head.weight" not in weights
    config = dataclasses.replace(config, tie_word_embeddings=tied)
    return GGUFContents(config, meta, weights, quantized)
