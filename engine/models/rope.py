"""Rotary position embeddings (HF half-split layout) with the config's scaling type."""

from __future__ import annotations

import math

import torch

from engine.config import ModelConfig


class UnsupportedRopeScalingError(ValueError):
    """The config names a rope scaling type this engine does not implement."""


def _inverse_frequencies(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """inv_freq [head_dim // 2] in float64 and the attention factor applied to cos and sin."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv_freq, 1.0
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv_freq / factor, 1.0
    if kind == "llama3":
        return _llama3(inv_freq, factor, scaling), 1.0
    if kind == "yarn":
        return _yarn(inv_freq, factor, scaling, config)
    raise UnsupportedRopeScalingError(f"rope scaling type {kind!r} is not supported (default, linear, llama3, yarn)")


def _llama3(inv_freq: torch.Tensor, factor: float, scaling: dict) -> torch.Tensor:
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    smooth = ((original / wavelen - low) / (high - low)).clamp(0.0, 1.0)
    # smooth is 1 for short wavelengths (kept), 0 for long ones (divided by factor).
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


def _yarn(inv_freq: torch.Tensor, factor: float, scaling: dict, config: ModelConfig) -> tuple[torch.Tensor, float]:
    dim, base = config.head_dim, config.rope_theta
    original = scaling.get("original_max_position_embeddings", config.max_position_embeddings)

    def correction_dim(num_rotations: float) -> float:
        return dim * math.log(original / (num_rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(scaling.get("beta_fast", 32))), 0)
    high = min(math.ceil(correction_dim(scaling.get("beta_slow", 1))), dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)).clamp(0.0, 1.0)
    extrapolated = 1 - ramp
    scaled = inv_freq / factor * (1 - extrapolated) + inv_freq * extrapolated
    attention_factor = scaling.get("attention_factor") or 0.1 * math.log(factor) + 1.0
    return scaled, attention_factor


class RotaryEmbedding(torch.nn.Module):
    """Precomputed cos/sin tables [max_positions, head_dim]; applied per token position."""

    def __init__(self, config: ModelConfig, max_positions: int) -> None:
        super().__init__()
        inv_freq, attention_factor = _inverse_frequencies(config)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)
        angles = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", (angles.cos() * attention_factor).float(), persistent=False)
        self.register_buffer("sin", (angles.sin() * attention_factor).float(), persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [T, H, D], k: [T, KVH, D], positions: [T] -> rotated q, k (same dtypes)."""
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated_half = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rotated_half.float() * sin).to(x.dtype)
