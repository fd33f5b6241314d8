"""Logprobs of sampled tokens and of prompt tokens, computed on the device.

The rank of a token is ``1 +`` the number of tokens with a strictly larger logprob
(vLLM's convention), so the argmax has rank 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LogprobsTensors:
    """All on the device, num_rows = n; N = the largest number of top logprobs asked."""

    top_ids: torch.Tensor
    """[n, N] int64, most probable first."""
    top_logprobs: torch.Tensor
    """[n, N] float32."""
    token_logprobs: torch.Tensor
    """[n] float32: logprob of the sampled (or next prompt) token."""
    token_ranks: torch.Tensor
    """[n] int64: its rank."""


def gather_logprobs(logprobs: torch.Tensor, token_ids: torch.Tensor, num_top: int) -> LogprobsTensors:
    """logprobs [n, V] (normalised), token_ids [n] int64 -> their logprobs, ranks and the top ``num_top``."""
    token_logprobs = logprobs.gather(1, token_ids[:, None]).squeeze(1)
    ranks = (logprobs > token_logprobs[:, None]).sum(dim=-1) + 1
    top_logprobs, top_ids = logprobs.topk(num_top, dim=-1)
    return LogprobsTensors(top_ids, top_logprobs, token_logprobs, ranks)


def compute_prompt_logprobs(logits: torch.Tensor, next_token_ids: torch.Tensor, num_top: int) -> LogprobsTensors:
    """Prompt logprobs: logits [P, V] at prompt positions, next_token_ids [P] (the token that follows each)."""
    return gather_logprobs(torch.log_softmax(logits.float(), dim=-1), next_token_ids, num_top)
