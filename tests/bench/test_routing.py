"""`bench.routing`'s engines hold the prefixes its scale says, whichever model they run: the KV
cache is sized from the model's own block bytes."""

from __future__ import annotations

from bench.routing import BLOCK_SIZE, FULL, MAX_TOKENS, app_options
from engine.config import DEFAULT_MODEL


def test_each_engines_cache_holds_the_scales_prefixes_for_any_model():
    blocks_per_prompt = -(-(FULL.shape.prefix_tokens + FULL.shape.suffix_tokens + MAX_TOKENS) // BLOCK_SIZE)
    tiny = app_options("tiny-random", FULL)
    assert tiny["kv_cache_memory"] == FULL.cached_prefixes * blocks_per_prompt * 8192  # 2 layers, 2 KV heads of 16, float32
    default = app_options(DEFAULT_MODEL, FULL)
    assert default["kv_cache_memory"] == FULL.cached_prefixes * blocks_per_prompt * 30 * 2 * 3 * 64 * 4 * BLOCK_SIZE  # 30 layers, 3 KV heads of 64
    assert default["model"] == DEFAULT_MODEL and default["engine_cpu_threads"] == 1
