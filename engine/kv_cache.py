"""The KV cache: one contiguous region of ``max_model_len`` positions per slot."""

from __future__ import annotations

import torch

from engine.config import ModelConfig


class KVCache:
    """keys[layer], values[layer]: [max_num_seqs, num_kv_heads, max_model_len, head_dim].

    A request owns one slot for its lifetime; a freed slot is reused as is, since a
    new request only ever reads positions it has written.
    """

    def __init__(self, config: ModelConfig, max_num_seqs: int, max_model_len: int, dtype: torch.dtype, device: torch.device) -> None:
        shape = (max_num_seqs, config.num_kv_heads, max_model_len, config.head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
