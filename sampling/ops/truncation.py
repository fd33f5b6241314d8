"""Stage 5 (sampling/README.md, "The pipeline"): truncations on a candidate set, llama.cpp semantics, applied in this order.

All operate on the distribution left by the previous stages (renormalised), per row:

* min-p: keep tokens with ``p >= min_p * max p``.
* top-k: keep tokens with ``p >=`` the k-th largest kept probability (ties at the
  boundary are all kept).
* top-p: sorted by probability, keep the smallest prefix whose mass reaches
  ``top_p`` (the token that crosses it is kept; ``>=``).
* typical-p: sorted by ``|-log p - H|`` ascending (H the entropy), keep tokens while the
  mass before them is ``<= typical_p`` (llama.cpp's strict ``>`` break).
* top-nσ: keep tokens whose logit is ``>= max - n * std`` (mean and population std
  over the kept tokens' logits; invariant to temperature).
* XTC: with probability ``xtc_probability`` (a per-row coin, from the seed when the
  row is seeded) and when at least two kept tokens have ``p >= xtc_threshold``
  (and ``xtc_threshold <= 0.5``), remove all of them but the least probable.

The torch path avoids sorting the vocabulary when it can: it takes the ``width``
most probable tokens (`ScaledLogits.top`, from block maxima) and runs every stage there. A row is *covered*
when its kept set provably lies inside those candidates (top-k dropped the last
candidate, so no tie at the k-th value reaches past it; or the last candidate was dropped
by an upper-set stage with exact masses). If a row is not
covered, the caller retries with a wider set, the last width being the whole
vocabulary (a full sort); deciding that reads one bool on the host, which on CPU
costs nothing (on CUDA the Triton kernels run instead).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sampling.batch import RowParams
from sampling.features import Feature
from sampling.ops.top_tokens import ScaledLogits


@dataclass
class Candidates:
    """A row-wise candidate set, all [n, K]: K = V and ``ids`` None means the whole vocabulary in order.

    logits: temperature-scaled logits, descending when ``ids`` is set; probs: their
    probabilities under the full softmax; keep: the tokens still allowed.
    """

    logits: torch.Tensor
    probs: torch.Tensor
    ids: torch.Tensor | None
    keep: torch.Tensor

    def kept_probs(self) -> torch.Tensor:
        """[n, K] probabilities of kept tokens, 0 elsewhere (not renormalised)."""
        return torch.where(self.keep, self.probs, torch.zeros_like(self.probs))

    def token_ids(self) -> torch.Tensor:
        """The token id of each column: ``ids`` [n, K], or [V] for the whole vocabulary."""
        return self.ids if self.ids is not None else torch.arange(self.keep.shape[1], device=self.keep.device)

    def id_at(self, column: torch.Tensor) -> torch.Tensor:
        """[n] token ids at ``column`` [n] int64."""
        return column if self.ids is None else self.ids.gather(1, column[:, None]).squeeze(1)


def whole_vocab(scaled: torch.Tensor) -> Candidates:
    """Every token a candidate, unsorted (when no truncation runs)."""
    return Candidates(scaled, torch.softmax(scaled, dim=-1), None, scaled > float("-inf"))


def top_candidates(scaled: ScaledLogits, width: int) -> Candidates:
    """The ``width`` largest scaled logits per row, sorted descending (a full sort when width >= V)."""
    if width >= scaled.logits.shape[-1]:
        logits, ids = scaled.dense().sort(dim=-1, descending=True)
    else:
        logits, ids = scaled.top(width)
    return Candidates(logits, torch.exp(logits - scaled.lse), ids, logits > float("-inf"))


def apply_truncations(c: Candidates, p: RowParams, stages: frozenset[Feature], coin: torch.Tensor) -> torch.Tensor:
    """Apply the active ``stages`` in order, updating ``c.keep``; returns ``covered`` [n] bool.

    coin: [n] uniform in (0, 1), XTC's per-row chance.
    """
    width = c.keep.shape[1]
    topk_bounds = (p.top_k > 0) & (p.top_k < width) if Feature.TOP_K in stages else torch.zeros_like(p.is_greedy)
    tail_unknown = torch.zeros_like(p.is_greedy)
    if Feature.MIN_P in stages:
        apply_min_p(c, p.min_p)
        tail_unknown = (p.min_p > 0) & c.keep[:, -1]
    if Feature.TOP_K in stages:
        apply_top_k(c, p.top_k)
        topk_bounds &= ~c.keep[:, -1]  # a tie at the k-th value that reaches the last candidate may go on past it
    if Feature.TOP_P in stages:
        reaches_end = c.keep[:, -1] & ~topk_bounds
        tail = torch.where(reaches_end, (1.0 - c.probs.sum(dim=-1)).clamp(min=0.0), torch.zeros_like(p.top_p))
        apply_top_p(c, p.top_p, tail)
    covered = topk_bounds | (~c.keep[:, -1] & ~tail_unknown) | p.is_greedy
    if Feature.TYPICAL_P in stages:
        apply_typical_p(c, p.typical_p)
    if Feature.TOP_N_SIGMA in stages:
        apply_top_n_sigma(c, p.top_n_sigma)
    if Feature.XTC in stages:
        apply_xtc(c, p.xtc_threshold, p.xtc_probability, coin)
    return covered


def apply_min_p(c: Candidates, min_p: torch.Tensor) -> None:
    """min_p [n]; 0 disables."""
    top = c.kept_probs().amax(dim=-1, keepdim=True)
    c.keep &= c.probs >= min_p[:, None] * top


def apply_top_k(c: Candidates, top_k: torch.Tensor) -> None:
    """top_k [n] int64; <= 0 disables. Needs ``c`` sorted descending."""
    width = c.keep.shape[1]
    kth = c.probs.gather(1, (top_k - 1).clamp(0, width - 1)[:, None])
    c.keep &= (c.probs >= kth) | (top_k <= 0)[:, None]


def apply_top_p(c: Candidates, top_p: torch.Tensor, tail_mass: torch.Tensor) -> None:
    """top_p [n]; 1 disables. tail_mass [n]: kept mass outside the candidates. Needs ``c`` sorted."""
    kept = c.kept_probs()
    before = torch.cumsum(kept, dim=-1) - kept
    total = kept.sum(dim=-1) + tail_mass
    c.keep &= (before < (top_p * total)[:, None]) | (top_p >= 1.0)[:, None]


def apply_typical_p(c: Candidates, typical_p: torch.Tensor) -> None:
    """typical_p [n]; 1 disables. The kept set must lie inside the candidates."""
    kept = c.kept_probs()
    q = kept / kept.sum(dim=-1, keepdim=True)
    log_q = torch.log(q)
    entropy = -torch.where(c.keep, q * log_q, torch.zeros_like(q)).sum(dim=-1, keepdim=True)
    shifted = torch.where(c.keep, (-log_q - entropy).abs(), torch.full_like(q, float("inf")))
    order = shifted.argsort(dim=-1, stable=True)
    q_sorted = q.gather(1, order)
    before = torch.cumsum(q_sorted, dim=-1) - q_sorted
    keep_sorted = (before <= typical_p[:, None]) | (typical_p >= 1.0)[:, None]
    c.keep &= torch.empty_like(c.keep).scatter_(1, order, keep_sorted)


def apply_top_n_sigma(c: Candidates, n_sigma: torch.Tensor) -> None:
    """n_sigma [n]; <= 0 disables. Statistics over the kept tokens' logits."""
    count = c.keep.sum(dim=-1, keepdim=True)
    logits = torch.where(c.keep, c.logits, torch.zeros_like(c.logits))
    mean = logits.sum(dim=-1, keepdim=True) / count
    var = (torch.where(c.keep, c.logits - mean, torch.zeros_like(logits)) ** 2).sum(dim=-1, keepdim=True) / count
    top = torch.where(c.keep, c.logits, torch.full_like(logits, float("-inf"))).amax(dim=-1, keepdim=True)
    threshold = top - n_sigma[:, None] * var.sqrt()
    c.keep &= (c.logits >= threshold) | (n_sigma <= 0)[:, None]


def apply_xtc(c: Candidates, threshold: torch.Tensor, probability: torch.Tensor, coin: torch.Tensor) -> None:
    """threshold / probability / coin [n]. Needs ``c`` sorted descending."""
    kept = c.kept_probs()
    q = kept / kept.sum(dim=-1, keepdim=True)
    above = c.keep & (q >= threshold[:, None])
    count = above.sum(dim=-1, keepdim=True)
    rank = torch.cumsum(above.to(torch.int64), dim=-1) - 1
    active = (count >= 2) & (coin <= probability)[:, None] & (threshold <= 0.5)[:, None] & (probability > 0)[:, None]
    c.keep &= ~(active & above & (rank < count - 1))
