"""The paged KV cache: one pool of fixed-size blocks per layer, sized in bytes."""

from __future__ import annotations

import os

import torch

from engine.config import EngineConfig, ModelConfig
from sampling.device_copy import values_to_device

CPU_MEMORY_FRACTION = 0.1
"""Default share of the machine's available memory for the KV cache on the CPU."""
CUDA_MEMORY_FRACTION = 0.8
"""Default share of the device's free memory (after the weights are loaded) for the KV cache on CUDA."""


class PagedKVCache:
    """keys[layer], values[layer]: [num_blocks, block_size, num_kv_heads, head_dim].

    Block ``b`` holds ``block_size`` consecutive positions of whichever sequence's table lists
    it (`engine.kv.block_manager`); one more block, ``scratch_block``, belongs to no sequence: the
    padding rows of a captured decode step write and read it (`engine.decode_graphs`). Zero-filled: attention reads whole blocks and masks the
    positions past a sequence's end, which must hold finite values. Position-major blocks
    (not head-major) make a gathered table a view as [B, L, KVH, D]: one copy per read.
    """

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.scratch_block = num_blocks
        shape = (num_blocks + 1, block_size, config.num_kv_heads, config.head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy each (source, destination) block's keys and values in every layer (copy-on-write forks);
        of copies to one destination (its first taker was freed in the same step), the last counts."""
        if not copies:
            return
        last_source = {destination: source for source, destination in copies}
        device = self.keys[0].device
        sources = values_to_device(list(last_source.values()), torch.int64, device)
        destinations = values_to_device(list(last_source), torch.int64, device)
        for cache in (*self.keys, *self.values):
            cache[destinations] = cache[sources]


def pool_num_blocks(config: EngineConfig, model: ModelConfig, dtype: torch.dtype, device: torch.device) -> int:
    """Blocks in ``config.kv_cache_memory`` bytes; by default those in `available_memory`, but no more
    than ``max_num_seqs`` sequences of ``max_model_len`` positions fill. Raises ``ValueError`` if none fit."""
    size = bytes_per_block(model, config.block_size, dtype)
    if config.kv_cache_memory is not None:
        num_blocks = config.kv_cache_memory // size
    else:
        num_blocks = min(available_memory(device) // size, config.max_num_seqs * -(-config.max_model_len // config.block_size))
    if num_blocks < 1:
        raise ValueError(f"the KV cache gets {config.kv_cache_memory or 'no'} bytes; one block of {config.block_size} positions takes {size}")
    return num_blocks


def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Keys and values of every layer for ``block_size`` positions."""
    return 2 * config.num_layers * config.num_kv_heads * block_size * config.head_dim * dtype.itemsize


def available_memory(device: torch.device) -> int:
    """Bytes the KV cache may take by default: a share of free device memory (CUDA) or of
    the machine's available memory (CPU, ``MemAvailable`` in /proc/meminfo)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * CUDA_MEMORY_FRACTION)
    return int(host_available_bytes() * CPU_MEMORY_FRACTION)


def host_available_bytes() -> int:
    """The machine's available memory (``MemAvailable`` in /proc/meminfo, else the free pages)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
