"""Stage 5 (sampling/README.md, "The pipeline"): the exponential race ``argmax(p / q)``, ``q ~ Exp(1)`` from `seeded_noise`.

If ``q_i`` are independent Exp(1), ``argmax_i p_i / q_i`` is token ``i`` with probability
``p_i / sum(p)``, so the weights need not be normalised and removed tokens (weight 0)
are never drawn.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sampling.ops.seeded_noise import exponential_of_mixes, token_mixes
from sampling.ops.truncation import Candidates


@dataclass(frozen=True)
class Draw:
    """What truncating and drawing N rows gives (the torch path and the Triton kernel alike)."""

    token_ids: torch.Tensor
    """[N] int64: the drawn token; when rows verify drafts, the draft if accepted, else a draw without it."""
    accepted: torch.Tensor | None
    """[N] bool when rows verify drafts: the row's draft is accepted (False where there is none)."""
    processed: torch.Tensor | None
    """[N, V] the truncated logits (-inf where removed), when asked for."""

    def with_rows(self, rows: torch.Tensor, other: Draw) -> Draw:
        """This draw with ``rows`` ([n] int64) replaced by ``other`` (a draw of those rows only)."""

        def merged(mine: torch.Tensor | None, theirs: torch.Tensor | None) -> torch.Tensor | None:
            return None if mine is None or theirs is None else mine.index_copy(0, rows, theirs)

        return Draw(self.token_ids.index_copy(0, rows, other.token_ids), merged(self.accepted, other.accepted), merged(self.processed, other.processed))


RACE_CHUNK_ELEMENTS = 1 << 17
"""On the CPU a wide race goes this many [n, K] elements at a time, so the hash's int32 temporaries
(512 KB) stay in cache. A whole-vocabulary race (temperature only) of 256 rows over 49,152 tokens
took 368 ms with int64 temporaries in one piece, 33 ms in chunks on int32 (2 threads)."""


def exponential_race(weights: torch.Tensor, token_ids: torch.Tensor, row_keys: torch.Tensor) -> torch.Tensor:
    """Index of the winner per row, [n] int64. weights / token_ids [n, K] (token_ids may be [K]); row_keys [n]."""
    mixes = token_mixes(token_ids)
    per_row = mixes.dim() == 2
    winners = [_race(weights[rows], mixes[rows] if per_row else mixes, row_keys[rows]) for rows in _row_chunks(weights)]
    return torch.cat(winners)


def whole_vocab_race(logits: torch.Tensor, temperature: torch.Tensor, row_keys: torch.Tensor) -> torch.Tensor:
    """[n] int64 token ids: `draw` from `whole_vocab` candidates of ``logits / temperature`` ([n, V],
    temperature [n]) with the same bits, with the softmax taken chunk by chunk beside the race so that
    no [n, V] temporary leaves the cache (a removed token's probability is exactly 0 already)."""
    mixes = token_mixes(torch.arange(logits.shape[1], device=logits.device))
    winners = [_race(torch.softmax(logits[rows] / temperature[rows, None], dim=-1), mixes, row_keys[rows]) for rows in _row_chunks(logits)]
    return torch.cat(winners)


def _row_chunks(weights: torch.Tensor) -> list[slice]:
    """The rows of [n, K] ``weights`` in chunks of about `RACE_CHUNK_ELEMENTS` elements (one chunk off the CPU)."""
    rows = weights.shape[0] if weights.device.type != "cpu" else max(1, RACE_CHUNK_ELEMENTS // max(weights.shape[1], 1))
    return [slice(start, start + rows) for start in range(0, max(weights.shape[0], 1), rows)]


def _race(weights: torch.Tensor, mixes: torch.Tensor, row_keys: torch.Tensor) -> torch.Tensor:
    # max(dim).indices is argmax (the first maximum) at a third of its cost on the CPU.
    return (weights / exponential_of_mixes(row_keys, mixes)).max(dim=-1).indices


def draw(c: Candidates, row_keys: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """One token id per row from the kept candidates, [n] int64.

    weights: [n, K] to race instead of ``c.kept_probs()`` (a subset of it, e.g. with a token removed).
    """
    weights = c.kept_probs() if weights is None else weights
    return c.id_at(exponential_race(weights, c.token_ids(), row_keys))
