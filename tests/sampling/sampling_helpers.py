"""Shared test helpers: batches of identical rows, a float64 reference distribution, chi-square."""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats

from sampling.batch import SamplingBatch
from sampling.params import SamplingParams
from sampling.tokenized import Encode, tokenize_strings

TRUNCATION_CONFIGS: dict[str, dict[str, float]] = {
    "temperature": dict(temperature=0.8),
    "top_k": dict(top_k=6),
    "top_p": dict(top_p=0.7),
    "top_k_top_p": dict(top_k=10, top_p=0.8),
    "min_p_temperature": dict(min_p=0.05, temperature=1.5),
    "typical_p": dict(typical_p=0.6),
    "top_n_sigma": dict(top_n_sigma=1.0),
    "xtc": dict(xtc_threshold=0.05, xtc_probability=0.5),
    "everything": dict(temperature=1.3, min_p=0.01, top_k=20, top_p=0.95, typical_p=0.9, top_n_sigma=2.0,
                       xtc_threshold=0.08, xtc_probability=0.7),
}  # fmt: skip
"""Sampling configurations whose distributions are checked on both paths."""


def char_encode(vocab: int) -> Encode:
    """A tokenizer stand-in: one id per character (``ord(c) % vocab``), no special tokens to add."""

    def encode(text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) % vocab for c in text]

    return encode


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
"""Where tests that run both sampling paths put their tensors: the Triton path runs natively on CUDA, interpreted on the CPU."""


def batch_of(params: list[SamplingParams], vocab: int, prompt: list[int] | None = None, device: str = "cpu", **kwargs) -> SamplingBatch:
    """A batch on ``device`` with one row per params entry, rows 0..n-1."""
    batch = SamplingBatch(len(params), vocab, 64, device, **kwargs)
    for row, p in enumerate(params):
        batch.add_request(row, p, prompt or [0], tokenize_strings(p, char_encode(vocab)))
    return batch


def reference_probs(
    logits: np.ndarray,
    temperature: float = 1.0,
    min_p: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    typical_p: float = 1.0,
    top_n_sigma: float = -1.0,
    xtc_threshold: float = 0.1,
    xtc_probability: float = 0.0,
) -> np.ndarray:
    """The exact target distribution [V] in float64, written independently (sort-based, one row)."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    keep = np.isfinite(z)

    def probs(mask: np.ndarray) -> np.ndarray:
        w = np.where(mask, np.exp(z - z[mask].max()), 0.0)
        return w / w.sum()

    if min_p > 0:
        p = probs(keep)
        keep &= p >= min_p * p.max()
    if top_k > 0:
        p = probs(keep)
        kth = np.sort(p[keep])[::-1][min(top_k, keep.sum()) - 1]
        keep &= p >= kth
    if top_p < 1:
        p = probs(keep)
        order = np.argsort(-p, kind="stable")
        before = np.cumsum(p[order]) - p[order]
        keep[order[before >= top_p]] = False
    if typical_p < 1:
        p = probs(keep)
        entropy = -(p[keep] * np.log(p[keep])).sum()
        shifted = np.where(keep, np.abs(-np.log(np.where(keep, p, 1.0)) - entropy), np.inf)
        order = np.argsort(shifted, kind="stable")
        before = np.cumsum(p[order]) - p[order]
        keep[order[before > typical_p]] = False
    if top_n_sigma > 0:
        kept = z[keep]
        keep &= z >= kept.max() - top_n_sigma * kept.std()
    final = probs(keep)
    if xtc_probability > 0 and xtc_threshold <= 0.5:
        above = keep & (final >= xtc_threshold)
        if above.sum() >= 2:
            lowest = np.where(above, final, np.inf).argmin()
            removed = keep & ~(above & (np.arange(len(z)) != lowest))
            final = (1 - xtc_probability) * final + xtc_probability * probs(removed)
    return final


def assert_matches(samples: np.ndarray, expected: np.ndarray, alpha: float = 1e-3) -> None:
    """Chi-square goodness of fit (bins with expected count < 5 merged); never draws outside the support."""
    n = len(samples)
    counts = np.bincount(samples, minlength=len(expected)).astype(np.float64)
    outside = counts[expected == 0].sum()
    assert outside == 0, f"{outside} draws of tokens with target probability 0"
    exp_counts = expected * n
    big = exp_counts >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(exp_counts[big], exp_counts[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    if len(obs) < 2:
        assert obs[0] == n
        return
    result = stats.chisquare(obs, exp * obs.sum() / exp.sum())
    assert result.pvalue > alpha, f"chi-square p={result.pvalue:.2e}\nobs={obs}\nexp={exp}"


def fixed_logits(vocab: int, seed: int = 0, scale: float = 2.0) -> torch.Tensor:
    """[V] float32 logits, deterministic."""
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * scale


def verify_layout(drafts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(draft_token_ids [N], cu_num_rows [n+1]) for `Sampler.verify`: each request's drafts, then -1."""
    ids = [t for d in drafts for t in [*d, -1]]
    cu = np.cumsum([0] + [len(d) + 1 for d in drafts])
    return torch.tensor(ids, dtype=torch.int64), torch.tensor(cu, dtype=torch.int64)


def assert_same_distribution(a: np.ndarray, b: np.ndarray, num_cells: int, alpha: float = 1e-3) -> None:
    """Chi-square test of homogeneity of two samples of cell ids in [0, num_cells) (cells with < 10 draws merged)."""
    table = np.stack([np.bincount(a, minlength=num_cells), np.bincount(b, minlength=num_cells)]).astype(np.float64)
    big = table.sum(axis=0) >= 10
    table = np.concatenate([table[:, big], table[:, ~big].sum(axis=1, keepdims=True)], axis=1)
    table = table[:, table.sum(axis=0) > 0]
    result = stats.chi2_contingency(table)
    assert result.pvalue > alpha, f"chi-square p={result.pvalue:.2e}\n{table}"
