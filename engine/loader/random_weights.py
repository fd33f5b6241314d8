"""Models of a known shape with seeded random weights: for tests, and for benchmarks where speed
depends on the shape, not the values (a bare GPU machine cannot fetch real weights).

``tiny-random`` is a 2-layer Llama for tests and egress benchmarks; ``smollm2-shape-random`` has
the default model's exact shape; ``llama3-8b-shape-random`` has Llama-3-8B's. Each uses the
default model's tokenizer. The same name and seed give the same weights on every machine when
they are made on the CPU (``device="cpu"``); made on a GPU they are only the same on that GPU.
"""

from __future__ import annotations

import torch

from engine.config import ModelConfig
from engine.models.llama import LlamaForCausalLM

TINY_RANDOM = "tiny-random"
SMOLLM2_SHAPE_RANDOM = "smollm2-shape-random"
LLAMA3_8B_SHAPE_RANDOM = "llama3-8b-shape-random"

RANDOM_MODEL_SHAPES: dict[str, ModelConfig] = {
    TINY_RANDOM: ModelConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=8192,
        # Untied: with a tied head, the residual stream makes greedy repeat the input token.
        tie_word_embeddings=False,
    ),
    SMOLLM2_SHAPE_RANDOM: ModelConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    ),
    LLAMA3_8B_SHAPE_RANDOM: ModelConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
    ),
}


def random_weights(config: ModelConfig, seed: int = 0, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """HF-named weights for ``config``: norms 1, embeddings N(0, 1), every other matrix
    N(0, 0.25 / in_features), so activations keep their scale through the layers.

    The embedding is drawn again after the others (so tiny-random keeps the weights it has always had)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    shapes = parameter_shapes(config)
    weights = {
        name: torch.ones(shape, device=device, dtype=dtype)
        if name.endswith("norm.weight")
        else torch.randn(shape, generator=generator, device=device, dtype=dtype) * 0.5 / shape[-1] ** 0.5
        for name, shape in shapes.items()
    }
    weights["embed_tokens.weight"] = torch.randn(shapes["embed_tokens.weight"], generator=generator, device=device, dtype=dtype)
    return weights


def parameter_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        model = LlamaForCausalLM(config, max_positions=1)
    return {name: tuple(param.shape) for name, param in model.named_parameters()}
