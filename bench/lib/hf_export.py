"""A Spout checkpoint written as a Hugging Face Llama folder, so that another server (vLLM's CPU
build) and Spout serve the very same float32 weights and tokenizer.

``python -m bench.lib.hf_export MODEL FOLDER`` writes ``config.json``, ``model.safetensors``,
``generation_config.json`` and the tokenizer (``tokenizer.json``, ``tokenizer_config.json``)
of any model Spout loads: the default GGUF dequantized as Spout's loader does, or one of the
seeded random shapes (`EGRESS_TINY` is the egress benchmarks' shape: head_dim 64, which
vLLM's CPU attention needs, where ``tiny-random`` has 16).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from safetensors.torch import save_file

from engine.config import ModelConfig
from engine.loader.checkpoint import Checkpoint, load_checkpoint, random_checkpoint
from engine.loader.random_shapes import RANDOM_MODEL_SHAPES, TINY_RANDOM
from engine.loader.random_weights import random_weights

EGRESS_TINY = replace(RANDOM_MODEL_SHAPES[TINY_RANDOM], hidden_size=128, intermediate_size=256, num_heads=2, num_kv_heads=1, head_dim=64)
"""A 2-layer Llama of hidden 128 and head_dim 64 with the default model's tokenizer: a model whose
forward pass costs little next to the serving path around it."""


def egress_tiny_checkpoint() -> Checkpoint:
    """`EGRESS_TINY` with seeded random weights (the same on every machine)."""
    return replace(random_checkpoint(TINY_RANDOM), name="egress-tiny", config=EGRESS_TINY, weights=random_weights(EGRESS_TINY))


def hf_config(config: ModelConfig) -> dict[str, object]:
    """``config.json`` of a ``LlamaForCausalLM`` with ``config``'s shape."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }


def hf_weight_name(name: str) -> str:
    """Spout's weight names are HF's without the ``model.`` prefix (the head has none)."""
    return name if name == "lm_head.weight" else f"model.{name}"


def export_hf_folder(checkpoint: Checkpoint, folder: Path) -> Path:
    """Write ``checkpoint`` into ``folder`` (created) as a HF model folder; returns ``folder``."""
    if checkpoint.config.rope_scaling or checkpoint.config.attention_bias:
        raise ValueError(f"{checkpoint.name}: only plain Llama shapes are exported")
    folder.mkdir(parents=True, exist_ok=True)
    weights = {hf_weight_name(name): tensor.float().contiguous() for name, tensor in checkpoint.weights.items()}
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(hf_config(checkpoint.config), indent=1) + "\n")
    tokenizer = checkpoint.tokenizer
    tokenizer.tokenizer.save(str(folder / "tokenizer.json"))
    token_text = tokenizer.tokenizer.id_to_token
    settings = {
        "bos_token": None if tokenizer.bos_token_id is None else token_text(tokenizer.bos_token_id),
        "eos_token": token_text(tokenizer.eos_token_ids[0]),
        "chat_template": tokenizer.chat_template,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": checkpoint.config.max_position_embeddings,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=1) + "\n")
    generation = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": list(tokenizer.eos_token_ids)}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=1) + "\n")
    return folder


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="'egress-tiny', or any model name or path Spout loads")
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    checkpoint = egress_tiny_checkpoint() if args.model == "egress-tiny" else load_checkpoint(args.model)
    print(export_hf_folder(checkpoint, args.folder))


if __name__ == "__main__":
    main()
