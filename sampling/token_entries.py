"""Sparse per-token logit edits of each row: ``logit_bias``, ``bad_words``, ``min_tokens`` bans.

Each edit is an entry (row, token, value) with a gate deciding, per step on the device,
whether it applies: always (logit bias, single-token bad words), while the row has
fewer than ``min_tokens`` outputs (stop / EOS ids), or when the row's last outputs
equal the entry's prefix (multi-token bad words: the last token of a bad word is
banned when the tokens before it were just generated, vLLM semantics; each bad word
is encoded both as given and with a leading space).

The host keeps each row's entries as small tables; the flat device tables (one per
prefix length) are concatenated from them on the next step after a join or leave that
changed them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sampling.device_copy import to_device
from sampling.params import SamplingParams
from sampling.tokenized import TokenizedStrings

NEG_INF = float("-inf")


@dataclass(frozen=True)
class Entry:
    token: int
    value: float
    min_tokens: int = 0
    """Applies only while the row's output count is below this (0: no such gate)."""
    prefix: tuple[int, ...] = ()
    """Applies only when the row's last outputs equal this (empty: no such gate)."""


def entries_for(params: SamplingParams, eos_token_ids: tuple[int, ...], strings: TokenizedStrings) -> list[Entry]:
    """All logit edits of one request; its bad words come tokenized in ``strings``."""
    if params.bad_words and not strings.bad_words:
        raise ValueError("bad_words: pass the request's TokenizedStrings (sampling.tokenized.tokenize_strings)")
    entries = [Entry(token, bias) for token, bias in params.logit_bias.items() if bias != 0.0]
    if params.min_tokens > 0:
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
        entries += [Entry(token, NEG_INF, min_tokens=params.min_tokens) for token in sorted(stops)]
    entries += [Entry(sequence[-1], NEG_INF, prefix=sequence[:-1]) for sequence in strings.bad_words]
    return entries


@dataclass(frozen=True)
class EntryTable:
    """Flat table of E entries whose prefixes all have length P: slot/token/min_tokens [E] int64,
    value [E] f32, prefix [E, P] int64."""

    slot: torch.Tensor
    token: torch.Tensor
    value: torch.Tensor
    min_tokens: torch.Tensor
    prefix: torch.Tensor
    has_min_tokens: bool
    has_prefix: bool


class TokenEntries:
    """Each row's entries as host tables (built when it joins, in the time of its own entries)
    and the device tables, concatenated from them on the next step after a change.

    One table per prefix length, so an entry costs its own prefix's length, never the
    longest prefix of another request; a rebuild costs a concatenation per row, not a pass
    over every row's entries in Python.
    """

    def __init__(self, max_num_rows: int, device: torch.device) -> None:
        self.device = device
        self._rows: list[dict[int, EntryTable]] = [{} for _ in range(max_num_rows)]
        self._tables: list[EntryTable] = []
        self._dirty = False

    def set_row(self, row: int, entries: list[Entry]) -> None:
        if entries or self._rows[row]:
            self._dirty = True
        self._rows[row] = _host_tables(row, entries)

    def tables(self) -> list[EntryTable]:
        """The device tables, by increasing prefix length (empty when no row has entries)."""
        if self._dirty:
            widths = sorted({width for row in self._rows for width in row})
            self._tables = [self._concatenate([row[width] for row in self._rows if width in row]) for width in widths]
            self._dirty = False
        return self._tables

    def _concatenate(self, parts: list[EntryTable]) -> EntryTable:
        def cat(name: str) -> torch.Tensor:
            return to_device(torch.cat([getattr(part, name) for part in parts]), self.device)

        return EntryTable(
            slot=cat("slot"),
            token=cat("token"),
            value=cat("value"),
            min_tokens=cat("min_tokens"),
            prefix=cat("prefix"),
            has_min_tokens=any(part.has_min_tokens for part in parts),
            has_prefix=parts[0].has_prefix,
        )


def _host_tables(row: int, entries: list[Entry]) -> dict[int, EntryTable]:
    """One row's entries as CPU tables, by prefix length."""
    by_width: dict[int, list[Entry]] = {}
    for e in entries:
        by_width.setdefault(len(e.prefix), []).append(e)
    return {
        width: EntryTable(
            slot=torch.full((len(group),), row, dtype=torch.int64),
            token=torch.tensor([e.token for e in group], dtype=torch.int64),
            value=torch.tensor([e.value for e in group], dtype=torch.float32),
            min_tokens=torch.tensor([e.min_tokens for e in group], dtype=torch.int64),
            prefix=torch.tensor([e.prefix for e in group], dtype=torch.int64).view(len(group), width),
            has_min_tokens=any(e.min_tokens > 0 for e in group),
            has_prefix=width > 0,
        )
        for width, group in by_width.items()
    }
