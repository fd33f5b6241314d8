"""Stage 2 (sampling/README.md, "The pipeline"): masks and the sparse logit edits (``allowed_token_ids``, ``bad_words``, ``min_tokens``,
``logit_bias``, the grammar bitmask of structured outputs)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sampling.token_entries import EntryTable


class AllTokensMaskedError(ValueError):
    """A request's masks (allowed_token_ids, bad_words, min_tokens) leave no token to sample."""


def apply_allowed(logits: torch.Tensor, allowed: torch.Tensor) -> None:
    """In place: logits [n, V] set to -inf where ``allowed`` [n, V] bool is False."""
    logits.masked_fill_(~allowed, float("-inf"))


@dataclass(frozen=True)
class GrammarMask:
    """This step's next-token bitmasks of the constrained rows, filled on the host by their grammar matchers."""

    bitmask: torch.Tensor
    """[M, ceil(V / 32)] int32 on the logits' device: bit ``t % 32`` of word ``t // 32`` set when token ``t`` is allowed."""
    rows: torch.Tensor
    """[M] int64 distinct logits rows the bitmasks belong to (with drafts: each verification row of a request)."""


def apply_grammar_mask(logits: torch.Tensor, mask: GrammarMask) -> None:
    """In place: logits [N, V] set to -inf at the tokens ``mask`` forbids in its rows."""
    vocab = logits.shape[1]
    bits = torch.arange(32, dtype=torch.int32, device=logits.device)
    allowed = ((mask.bitmask[:, :, None] >> bits) & 1).bool().flatten(1)  # [M, 32 * words]
    if allowed.shape[1] < vocab:
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]), value=False)
    logits[mask.rows] = logits[mask.rows].masked_fill_(~allowed[:, :vocab], float("-inf"))


def rows_left_empty(logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """[N] bool, True at those of ``rows`` ([M] int64) where every token of ``logits`` [N, V] is masked; no host sync."""
    empty = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    empty[rows] = ~torch.isfinite(logits[rows].amax(dim=-1))
    return empty


def apply_token_entries(
    logits: torch.Tensor,
    table: EntryTable,
    rows: torch.Tensor,
    output_pos: torch.Tensor,
    last_outputs: torch.Tensor | None,
) -> None:
    """In place: add each active entry's value (a bias or -inf) to ``logits`` [N, V].

    rows: [E, J] the logits rows of each entry's slot (-1: none; a slot has several rows when
    drafts are verified). output_pos: [N] outputs before each row. last_outputs: [N, P] each
    row's last P outputs, oldest first, -1 where there are fewer (needed only when entries
    have prefixes). Inactive pairs add 0 to row 0, so no host-side filtering (and no sync) is needed.
    """
    row = rows.clamp(min=0)
    active = rows >= 0
    if table.has_min_tokens:
        min_tokens = table.min_tokens[:, None]
        active &= (min_tokens == 0) | (output_pos[row] < min_tokens)
    if table.has_prefix:
        assert last_outputs is not None
        active &= (last_outputs[row] == table.prefix[:, None, :]).all(dim=2)
    values = torch.where(active, table.value[:, None], torch.zeros_like(table.value)[:, None])
    logits.index_put_((row, table.token[:, None].expand_as(row)), values, accumulate=True)


def check_some_token_left(logits: torch.Tensor) -> None:
    """Raise `AllTokensMaskedError` if a row of ``logits`` [n, V] is all -inf.

    This reads one bool on the host; the sampler calls it only when a row can mask every
    token dynamically (an allowlist combined with multi-token bad words). Static cases
    are rejected when the request joins.
    """
    if not bool(torch.isfinite(logits.amax(dim=-1)).all()):
        raise AllTokensMaskedError("every token is masked for a request (allowed_token_ids with bad_words)")
