"""A step's beam rows as the model runner gets them, and their next-token candidates on the device."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.request import Request


@dataclass(frozen=True)
class BeamRows:
    """The beam sequences sampled in one step, in batch order (`BeamGroups.plan_rows`).

    logits_indices: each one's flat index of its last position in the step.
    allowed_biases: each one's search's ``allowed_token_ids`` as a [V] bias on the device (None: every token).
    num_candidates: next tokens each row needs, the widest search's `BeamSpec.num_candidates`.
    """

    sequences: list[Request]
    logits_indices: list[int]
    allowed_biases: list[torch.Tensor | None]
    num_candidates: int


def candidate_tensors(logits: torch.Tensor, rows: BeamRows) -> list[torch.Tensor]:
    """logits [B, V] of the beam rows -> [token ids [B, k], logprobs [B, k]], k ``rows.num_candidates``
    (at most V), most probable first: the model's log-softmax over each search's allowed tokens."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    for row, bias in enumerate(rows.allowed_biases):
        if bias is not None:
            logprobs[row] = torch.log_softmax(logprobs[row] + bias, dim=-1)
    top = logprobs.topk(min(rows.num_candidates, logits.shape[-1]), dim=-1)
    return [top.indices, top.values]
