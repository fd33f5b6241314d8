"""Stage 3 masks and the sparse logit edits (``allowed_token_ids``, ``bad_words``, ``min_tokens``, ``logit_bias``)."""

from __future__ import annotations

import torch

from sampling.token_entries import EntryTable


class AllTokensMaskedError(ValueError):
    """A request's masks (allowed_token_ids, bad_words, min_tokens) leave no token to sample."""


def apply_allowed(logits: torch.Tensor, allowed: torch.Tensor) -> None:
    """In place: logits [n, V] set to -inf where ``allowed`` [n, V] bool is False."""
    logits.masked_fill_(~allowed, float("-inf"))


def slot_positions(rows: torch.Tensor, max_num_rows: int) -> torch.Tensor:
    """[max_num_rows] int64: the position of each slot in this step's ``rows`` [n], -1 when absent."""
    positions = torch.full((max_num_rows,), -1, dtype=torch.int64, device=rows.device)
    positions[rows] = torch.arange(rows.shape[0], device=rows.device)
    return positions


def apply_token_entries(
    logits: torch.Tensor,
    table: EntryTable,
    positions: torch.Tensor,
    output_pos: torch.Tensor,
    history: torch.Tensor | None,
    history_len: torch.Tensor | None,
) -> None:
    """In place: add each active entry's value (a bias or -inf) to ``logits`` [n, V].

    positions: [R] slot -> row of ``logits`` (-1: slot not sampled this step).
    output_pos: [R] outputs so far per slot. history / history_len: [R, L] / [R] token history
    (prompt then outputs), needed only when entries have prefixes.
    Inactive entries add 0 to row 0, so no host-side filtering (and no sync) is needed.
    """
    row = positions[table.slot]
    active = row >= 0
    if table.has_min_tokens:
        active &= (table.min_tokens == 0) | (output_pos[table.slot] < table.min_tokens)
    if table.has_prefix:
        assert history is not None and history_len is not None
        active &= _prefix_matches(table, output_pos, history, history_len)
    values = torch.where(active, table.value, torch.zeros_like(table.value))
    logits.index_put_((row.clamp(min=0), table.token), values, accumulate=True)


def _prefix_matches(
    table: EntryTable, output_pos: torch.Tensor, history: torch.Tensor, history_len: torch.Tensor
) -> torch.Tensor:
    """[E] bool: the slot's last outputs equal the entry's prefix ([E, P], -1 padded on the left)."""
    width = table.prefix.shape[1]
    end = history_len[table.slot]  # [E]
    first_output = end - output_pos[table.slot]
    index = end[:, None] - width + torch.arange(width, device=end.device)  # [E, P]
    tokens = history[table.slot[:, None], index.clamp(min=0)]
    padding = table.prefix < 0
    return (padding | ((tokens == table.prefix) & (index >= first_output[:, None]))).all(dim=1)


def check_some_token_left(logits: torch.Tensor) -> None:
    """Raise `AllTokensMaskedError` if a row of ``logits`` [n, V] is all -inf.

    This reads one bool on the host; the sampler calls it only when a row can mask every
    token dynamically (an allowlist combined with multi-token bad words). Static cases
    are rejected when the request joins.
    """
    if not bool(torch.isfinite(logits.amax(dim=-1)).all()):
        raise AllTokensMaskedError("every token is masked for a request (allowed_token_ids with bad_words)")
