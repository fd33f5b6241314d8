"""Stage 3 (sampling/README.md, "The pipeline"): DRY ("don't repeat yourself") penalty, llama.cpp semantics, batched.

For a row with context ``x`` (prompt then outputs; only the last ``dry_penalty_last_n``
tokens, -1 = all), let ``limit`` be the number of tokens after the last sequence-breaker
token. For each earlier position ``j``, ``m_j`` is the length of the longest common
suffix of ``x[..j]`` and ``x`` (capped at ``limit`` and `MAX_MATCH`). The token
``x[j + 1]`` that continued that earlier occurrence gets
``multiplier * base ** (max_j m_j - allowed_length)`` subtracted when
``m_j >= allowed_length``; nothing happens if ``limit <= allowed_length`` or the window
has at most ``allowed_length`` tokens. Breaker tokens themselves are never penalised.
Breaker strings are reduced to the set of their tokens (multi-token breakers act as
if each of their tokens were a breaker), given as a [n, V] mask, so any number of
breakers costs the same.
"""

from __future__ import annotations

import math

import torch

MAX_MATCH = 32
"""Match lengths are capped here; at the default base 1.75 the penalty is then already > 1e6."""
FLOAT_MAX_LOG = 88.7228391


def apply_dry(
    logits: torch.Tensor,
    history: torch.Tensor,
    history_len: torch.Tensor,
    breaker_mask: torch.Tensor,
    multiplier: torch.Tensor,
    base: torch.Tensor,
    allowed_length: torch.Tensor,
    last_n: torch.Tensor,
) -> torch.Tensor:
    """DRY-penalised logits [n, V].

    history [n, L] int64 (-1 past the end), history_len [n], breaker_mask [n, V] bool,
    multiplier / base [n] float, allowed_length / last_n [n] int64.
    """
    n, L = history.shape
    pos = torch.arange(L, device=history.device)
    last = history_len - 1
    window = torch.where(last_n < 0, history_len, torch.minimum(last_n, history_len))
    start = history_len - window
    in_window = (pos >= start[:, None]) & (pos <= last[:, None])
    is_breaker = breaker_mask.gather(1, history.clamp(min=0)) & (history >= 0)
    last_breaker = torch.where(is_breaker & in_window, pos, start[:, None] - 1).amax(dim=1)
    limit = last - last_breaker  # tokens after the last breaker
    match = _match_lengths(history, last, start, limit, pos)
    following = torch.roll(history, -1, dims=1)
    valid = (match >= allowed_length[:, None]) & (pos < last[:, None]) & in_window
    valid &= ((limit > allowed_length) & (window > allowed_length) & (multiplier > 0))[:, None]
    max_exp = torch.where(base > 1.000001, FLOAT_MAX_LOG / torch.log(base), torch.full_like(base, math.inf))
    exponent = torch.minimum((match - allowed_length[:, None]).to(logits.dtype), max_exp[:, None])
    penalty = multiplier[:, None] * torch.pow(base[:, None], exponent)
    penalty = torch.where(valid, penalty, torch.zeros_like(penalty))
    per_token = torch.zeros_like(logits).scatter_reduce_(1, following.clamp(min=0), penalty, reduce="amax")
    return logits - per_token.masked_fill_(breaker_mask, 0.0)


def _match_lengths(history: torch.Tensor, last: torch.Tensor, start: torch.Tensor, limit: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """[n, L] int64: for each j, the common-suffix length of ``history[..j]`` and ``history[..last]``."""
    match = torch.zeros_like(history)
    alive = torch.ones_like(history, dtype=torch.bool)
    for k in range(MAX_MATCH):
        suffix_token = history.gather(1, (last - k).clamp(min=0)[:, None])  # [n, 1]
        earlier = torch.roll(history, k, dims=1)  # earlier[:, j] = history[:, j - k]
        alive &= (earlier == suffix_token) & (pos - k >= start[:, None]) & (k < limit)[:, None]
        match += alive
    return match
