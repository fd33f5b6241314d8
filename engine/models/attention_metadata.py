"""Where each token of a flat step batch reads and writes the KV cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch

SHORT_CHUNK_TOKENS = 32


@dataclass
class AttentionGroup:
    """Sequences attended together in one padded SDPA call.

    token_index: [B, Q] int64 indices into the flat batch; padding points at row T (scratch).
    slots:       [B] int64 KV cache slot of each sequence.
    mask:        [B, 1, Q, L] bool, True where a query may attend a key position.
    """

    token_index: torch.Tensor
    slots: torch.Tensor
    mask: torch.Tensor

    @property
    def kv_len(self) -> int:
        return self.mask.shape[-1]


@dataclass
class AttentionMetadata:
    """slots, positions: [T] int64, the cache slot and position of each flat token."""

    slots: torch.Tensor
    positions: torch.Tensor
    groups: list[AttentionGroup]


@dataclass(frozen=True)
class ScheduledChunk:
    """``num_tokens`` consecutive tokens of one sequence, starting at cache ``position``."""

    slot: int
    position: int
    num_tokens: int


def build_attention_metadata(chunks: list[ScheduledChunk], device: torch.device) -> AttentionMetadata:
    """Metadata for a flat batch laid out as the chunks, in order, back to back.

    Decode chunks (one token), short chunks (verified drafts, prefill tails) and long
    prefill chunks form separate groups, so a long chunk does not pad every short query
    to its length.
    """
    slots = torch.cat([torch.full((c.num_tokens,), c.slot, dtype=torch.int64) for c in chunks])
    positions = torch.cat([torch.arange(c.position, c.position + c.num_tokens) for c in chunks])
    starts = [0]
    for chunk in chunks:
        starts.append(starts[-1] + chunk.num_tokens)
    num_tokens = starts[-1]
    size_classes = [0 if c.num_tokens == 1 else 1 if c.num_tokens <= SHORT_CHUNK_TOKENS else 2 for c in chunks]
    members_by_class = [[i for i, size in enumerate(size_classes) if size == wanted] for wanted in range(3)]
    groups = [_group([chunks[i] for i in members], [starts[i] for i in members], num_tokens) for members in members_by_class if members]
    return AttentionMetadata(
        slots=slots.to(device),
        positions=positions.to(device),
        groups=[AttentionGroup(g.token_index.to(device), g.slots.to(device), g.mask.to(device)) for g in groups],
    )


def _group(chunks: list[ScheduledChunk], starts: list[int], num_tokens: int) -> AttentionGroup:
    max_q = max(c.num_tokens for c in chunks)
    kv_len = max(c.position + c.num_tokens for c in chunks)
    offsets = torch.arange(max_q)
    counts = torch.tensor([c.num_tokens for c in chunks])
    valid = offsets[None, :] < counts[:, None]
    token_index = torch.where(valid, torch.tensor(starts)[:, None] + offsets[None, :], num_tokens)
    query_pos = torch.where(valid, torch.tensor([c.position for c in chunks])[:, None] + offsets[None, :], 0)
    mask = torch.arange(kv_len)[None, None, :] <= query_pos[:, :, None]
    return AttentionGroup(token_index=token_index, slots=torch.tensor([c.slot for c in chunks]), mask=mask.unsqueeze(1))
