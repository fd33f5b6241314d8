"""The KV cache: its tensors (`kv_cache`), the pool's bookkeeping of blocks and prefixes (`block_pool`),
each sequence's block table (`sequence_blocks`) and the tables' manager, forks and copy-on-write included (`block_manager`)."""
