"""Exact speculative verification of point-mass drafts (the torch reference of the kernel's draft mode).

A drafter proposes ``d`` with probability 1, so the speculative-sampling rule (accept with
probability ``min(1, p(d) / q(d))``, else draw from ``max(p - q, 0)`` renormalised) becomes:
accept ``d`` iff ``u <= p(d)``; on rejection draw from ``p`` with ``d`` removed. The emitted
token is then distributed exactly as ``p``. ``u`` is the row's uniform noise at the reserved
token id `ACCEPT_COIN_TOKEN`, independent of the race noise at real token ids, so the
recovery draw can reuse the row's race. A row without a draft (-1) is the plain draw.
"""

from __future__ import annotations

import torch

from sampling.ops.draw import draw
from sampling.ops.seeded_noise import uniform
from sampling.ops.truncation import Candidates

ACCEPT_COIN_TOKEN = -2
"""The acceptance test's uniform is the row's noise at this (out-of-vocabulary) token id."""


def accept_or_recover(c: Candidates, drafts: torch.Tensor, row_keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(token [N] int64, accepted [N] bool) per row: ``drafts`` [N] (-1: none), row_keys [N].

    token is the draft when accepted, else a draw from the kept candidates without it. A draft
    is also accepted when no other kept token has any weight left (float underflow).
    """
    weights = c.kept_probs()
    is_draft = c.token_ids() == drafts[:, None]
    others = weights.masked_fill(is_draft, 0.0)
    p_draft = (weights * is_draft).sum(dim=-1) / weights.sum(dim=-1)
    coin = uniform(row_keys, torch.full((1,), ACCEPT_COIN_TOKEN, dtype=torch.int64, device=row_keys.device)).squeeze(1)
    accepted = (drafts >= 0) & ((coin <= p_draft) | (others.amax(dim=-1) == 0))
    return torch.where(accepted, drafts, draw(c, row_keys, others)), accepted


def first_rejection(
    token_ids: torch.Tensor, accepted: torch.Tensor, first_rows: torch.Tensor, requests: torch.Tensor, num_requests: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep each request's rows up to its first non-accepted one: (token_ids [N] with -1 after it, num_emitted [n]).

    token_ids / accepted [N]: per row, what it emits if reached and whether its draft is accepted (False at
    each request's last row); first_rows / requests [N]: each row's request's first row and its index.
    """
    rejected = (~accepted).to(torch.int64)
    rejected_before = torch.cumsum(rejected, dim=0) - rejected
    emitted = rejected_before == rejected_before[first_rows]
    num_emitted = torch.zeros(num_requests, dtype=torch.int64, device=token_ids.device)
    num_emitted.index_add_(0, requests, emitted.to(torch.int64))
    return torch.where(emitted, token_ids, torch.full_like(token_ids, -1)), num_emitted
