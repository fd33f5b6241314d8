"""Seeded random weights for the models of `engine.loader.random_shapes`: for tests, and for benchmarks
where speed depends on the shape, not the values (a bare GPU machine cannot fetch real weights).

The same name and seed give the same weights on every machine when they are made on the CPU
(``device="cpu"``); made on a GPU they are only the same on that GPU.
"""

from __future__ import annotations

import torch

from engine.config import ModelConfig
from engine.models.llama import LlamaForCausalLM


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
