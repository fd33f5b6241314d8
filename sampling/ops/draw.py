"""Stage 7: the exponential race ``argmax(p / q)``, ``q ~ Exp(1)`` from `seeded_noise`.

If ``q_i`` are independent Exp(1), ``argmax_i p_i / q_i`` is token ``i`` with probability
``p_i / sum(p)``, so the weights need not be normalised and removed tokens (weight 0)
are never drawn.
"""

from __future__ import annotations

import torch

from sampling.ops.seeded_noise import exponential
from sampling.ops.truncation import Candidates


def exponential_race(weights: torch.Tensor, token_ids: torch.Tensor, row_keys: torch.Tensor) -> torch.Tensor:
    """Index of the winner per row, [n] int64. weights / token_ids [n, K] (token_ids may be [K]); row_keys [n]."""
    return (weights / exponential(row_keys, token_ids)).argmax(dim=-1)


def draw(c: Candidates, row_keys: torch.Tensor) -> torch.Tensor:
    """One token id per row from the kept candidates, [n] int64."""
    weights = c.kept_probs()
    if c.ids is None:
        return exponential_race(weights, torch.arange(weights.shape[1], device=weights.device), row_keys)
    winner = exponential_race(weights, c.ids, row_keys)
    return c.ids.gather(1, winner[:, None]).squeeze(1)
