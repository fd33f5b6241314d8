"""The names and shapes of the models with seeded random weights (`engine.loader.random_weights`); no torch.

``tiny-random`` is a 2-layer Llama for tests and egress benchmarks; ``smollm2-shape-random`` has
the default model's exact shape; ``llama3-8b-shape-random`` has Llama-3-8B's. Each uses the
default model's tokenizer.
"""

from __future__ import annotations

from engine.config import ModelConfig

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
