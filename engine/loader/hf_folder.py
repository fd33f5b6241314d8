"""Read a Hugging Face model folder: config.json and *.safetensors (sharded via an index)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from engine.config import ModelConfig

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


class UnsupportedModelError(ValueError):
    """The folder holds a model this engine cannot run."""


def config_from_hf(config: dict) -> ModelConfig:
    architectures = config.get("architectures") or []
    if not any(arch in SUPPORTED_ARCHITECTURES for arch in architectures):
        raise UnsupportedModelError(f"architectures {architectures} not supported (supported: {SUPPORTED_ARCHITECTURES})")
    num_heads = config["num_attention_heads"]
    hidden = config["hidden_size"]
    is_qwen2 = "Qwen2ForCausalLM" in architectures
    # transformers >= 5 writes rope_parameters (theta inside); older folders rope_theta + rope_scaling.
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    return ModelConfig(
        vocab_size=config["vocab_size"],
        hidden_size=hidden,
        intermediate_size=config["intermediate_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=config.get("num_key_value_heads") or num_heads,
        head_dim=config.get("head_dim") or hidden // num_heads,
        rms_norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=rope.get("rope_theta", config.get("rope_theta", 10000.0)),
        max_position_embeddings=config.get("max_position_embeddings", 2048),
        tie_word_embeddings=config.get("tie_word_embeddings", False),
        attention_bias=config.get("attention_bias", is_qwen2),
        rope_scaling=rope or None,
    )


def _safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [folder / name for name in sorted(set(weight_map.values()))]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} has no *.safetensors files")
    return files


def load_hf_checkpoint(folder: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Config and weights (names without the ``model.`` prefix) of a HF folder."""
    config = config_from_hf(json.loads((folder / "config.json").read_text()))
    weights: dict[str, torch.Tensor] = {}
    for file in _safetensors_files(folder):
        with safe_open(file, framework="pt") as tensors:
            for name in tensors.keys():  # noqa: SIM118 - safe_open is not a mapping
                weights[name.removeprefix("model.")] = tensors.get_tensor(name)
    return config, weights
