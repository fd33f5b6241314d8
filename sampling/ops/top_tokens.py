"""Sort-free row statistics for the torch (CPU) path: the first argmax, the ``width`` largest
logits and the logsumexp of the temperature-scaled logits, each in about one pass over [N, V].

torch's reductions along a long last dimension (``max(dim=-1)``, ``topk``) are slow on the
CPU, while an elementwise maximum across a few vectors is fast. So the vocabulary is cut into
``S = V / G`` strided blocks (block ``j`` holds tokens ``j, j + S, ..., j + (G - 1) S``) and
their maxima [N, S] are taken in one vectorised pass (`block_maxima`). Then:

* the row maximum is in the first block that holds it, at its first place there; it is the
  first argmax unless another block ties for the maximum (checked, then a plain argmax);
* the ``width`` largest logits lie in the ``width`` blocks with the largest maxima (a token
  outside them is below ``width`` block maxima), so `top_logits` takes ``topk`` over the block
  maxima and then over those blocks' ``width * G`` tokens instead of over all V.

`logsumexp_rows` works in row chunks of about a megabyte, which stay in cache and whose
temporaries the allocator reuses (a fresh [N, V] temporary costs page faults on every step).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK_SIZES = (8, 4, 2)
"""Tokens per block G, the first that divides the vocabulary (none: no blocks, plain reductions)."""
CHUNK_ELEMENTS = 2**18
"""Elements per row chunk of `logsumexp_rows` (1 MiB of float32)."""


@dataclass(frozen=True)
class ScaledLogits:
    """``logits[rows] / temperature[:, None]`` [n, V], not materialised, with the row statistics taken once per step."""

    logits: torch.Tensor
    """[N, V] float32 before temperature (n <= N rows of it stand here)."""
    rows: torch.Tensor | None
    """[n] int64 the rows of ``logits`` that stand here; None: all (n = N). The others stay uncopied."""
    temperature: torch.Tensor
    """[n] > 0."""
    maxima: torch.Tensor | None
    """[n, S] `block_maxima` of the rows, or None (no blocks: plain reductions)."""
    lse: torch.Tensor
    """[n, 1] logsumexp of the scaled logits."""

    def take(self, rows: torch.Tensor) -> ScaledLogits:
        """The same for ``rows`` ([k] int64 indices into the n rows) only."""
        maxima = None if self.maxima is None else self.maxima[rows]
        logits_rows = rows if self.rows is None else self.rows[rows]
        return ScaledLogits(self.logits, logits_rows, self.temperature[rows], maxima, self.lse[rows])

    def dense(self) -> torch.Tensor:
        """[n, V] the scaled logits."""
        logits = self.logits if self.rows is None else self.logits[self.rows]
        return logits / self.temperature[:, None]

    def top(self, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(scaled logits [n, width] descending, their token ids [n, width]); width < V."""
        values, ids = top_logits(self.logits, self.maxima, width, self.rows)
        return values / self.temperature[:, None], ids


def scaled_logits(logits: torch.Tensor, temperature: torch.Tensor, maxima: torch.Tensor | None) -> ScaledLogits:
    """logits [N, V] float32, temperature [N] > 0, maxima: `block_maxima` of ``logits`` or None."""
    return ScaledLogits(logits, None, temperature, maxima, logsumexp_rows(logits, temperature, maxima))


def block_size(vocab: int) -> int:
    """G, the tokens per block for this vocabulary size; 1 when no block size divides it."""
    return next((g for g in BLOCK_SIZES if vocab % g == 0), 1)


def block_maxima(logits: torch.Tensor) -> torch.Tensor | None:
    """logits [N, V] -> [N, V / G] the maximum of each strided block, or None when G is 1."""
    n, vocab = logits.shape
    g = block_size(vocab)
    return None if g == 1 else logits.view(n, g, vocab // g).amax(dim=1)


def first_argmax(logits: torch.Tensor, maxima: torch.Tensor | None) -> torch.Tensor:
    """[N] int64: the first maximum's index in each row of logits [N, V]; maxima: `block_maxima` or None.

    Reads one bool on the host (whether two blocks tie for a row's maximum).
    """
    if maxima is None:
        return logits.max(dim=-1).indices  # the first maximum, 3x faster than argmax on the CPU
    top, block = maxima.topk(2, dim=-1)
    if bool((top[:, 0] == top[:, 1]).any()):
        return logits.max(dim=-1).indices
    ids = _block_tokens(block[:, :1], maxima.shape[1], logits.shape[1])
    place = logits.gather(1, ids).max(dim=-1).indices
    return ids.gather(1, place[:, None]).squeeze(1)


def top_logits(logits: torch.Tensor, maxima: torch.Tensor | None, width: int, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(values [n, width] descending, ids [n, width]): the ``width`` largest logits of each of ``rows`` ([n] int64
    rows of logits [N, V]; None: all), ties broken arbitrarily as `torch.topk`. maxima: `block_maxima` of those rows, or None."""
    if maxima is None or width >= maxima.shape[1]:
        return (logits if rows is None else logits[rows]).topk(width, dim=-1)
    ids = _block_tokens(_top_places(maxima, width), maxima.shape[1], logits.shape[1])
    values = logits.gather(1, ids) if rows is None else logits[rows[:, None], ids]
    values, place = values.topk(width, dim=-1)
    return values, ids.gather(1, place)


def _top_places(values: torch.Tensor, width: int) -> torch.Tensor:
    """[N, width] the places of the ``width`` largest of values [N, L], unordered: through the
    maxima of its blocks while they are fewer than ``width * G`` (`torch.topk` costs per place)."""
    num_blocks = values.shape[1] // block_size(values.shape[1])
    if num_blocks == values.shape[1] or width * (values.shape[1] // num_blocks) >= values.shape[1]:
        return values.topk(width, dim=-1, sorted=False).indices
    maxima = block_maxima(values)
    assert maxima is not None
    places = _block_tokens(_top_places(maxima, width), num_blocks, values.shape[1])
    return places.gather(1, values.gather(1, places).topk(width, dim=-1, sorted=False).indices)


def _block_tokens(blocks: torch.Tensor, num_blocks: int, length: int) -> torch.Tensor:
    """[N, K * G] the places in a row of ``length`` of the strided blocks ``blocks`` [N, K] (of ``num_blocks``)."""
    steps = num_blocks * torch.arange(length // num_blocks, device=blocks.device)
    return (blocks[:, :, None] + steps).flatten(1)


def logsumexp_rows(logits: torch.Tensor, temperature: torch.Tensor, maxima: torch.Tensor | None) -> torch.Tensor:
    """[N, 1] logsumexp of ``logits / temperature[:, None]`` (logits [N, V], temperature [N]; maxima:
    `block_maxima` of logits or None), row chunk by chunk in one reused buffer."""
    n, vocab = logits.shape
    top = (logits if maxima is None else maxima).amax(dim=-1, keepdim=True) / temperature[:, None]
    top = torch.where(top.isfinite(), top, torch.zeros_like(top))  # a row without a finite logit: -inf
    rows = max(1, CHUNK_ELEMENTS // vocab)
    buffer = torch.empty(min(rows, n), vocab, dtype=logits.dtype, device=logits.device)
    total = torch.empty(n, dtype=logits.dtype, device=logits.device)
    for start in range(0, n, rows):
        end = min(start + rows, n)
        chunk = torch.div(logits[start:end], temperature[start:end, None], out=buffer[: end - start])
        torch.sum(chunk.sub_(top[start:end]).exp_(), dim=-1, out=total[start:end])
    return total.log()[:, None] + top
