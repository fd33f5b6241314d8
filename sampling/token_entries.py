"""Sparse per-token logit edits of each row: ``logit_bias``, ``bad_words``, ``min_tokens`` bans.

Each edit is an entry (row, token, value) with a gate deciding, per step on the device,
whether it applies: always (logit bias, single-token bad words), while the row has
fewer than ``min_tokens`` outputs (stop / EOS ids), or when the row's last outputs
equal the entry's prefix (multi-token bad words: the last token of a bad word is
banned when the tokens before it were just generated, vLLM semantics; each bad word
is encoded both as given and with a leading space).

The host keeps entries per row; the flat device tables (one per prefix length) are
rebuilt on the next step after a join or leave that changed them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

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
    """Flat device table of E entries whose prefixes all have length P: slot/token/min_tokens [E] int64,
    value [E] f32, prefix [E, P] int64."""

    slot: torch.Tensor
    token: torch.Tensor
    value: torch.Tensor
    min_tokens: torch.Tensor
    prefix: torch.Tensor
    has_min_tokens: bool
    has_prefix: bool


class TokenEntries:
    """Host lists of entries per row and their lazily rebuilt device tables.

    One table per prefix length, so an entry costs its own prefix's length, never the
    longest prefix of another request.
    """

    def __init__(self, max_num_rows: int, device: torch.device) -> None:
        self.device = device
        self._rows: list[list[Entry]] = [[] for _ in range(max_num_rows)]
        self._tables: list[EntryTable] = []
        self._dirty = False

    def set_row(self, row: int, entries: list[Entry]) -> None:
        if entries or self._rows[row]:
            self._dirty = True
        self._rows[row] = entries

    def tables(self) -> list[EntryTable]:
        """The device tables, by increasing prefix length (empty when no row has entries)."""
        if self._dirty:
            by_width: dict[int, list[tuple[int, Entry]]] = {}
            for row, entries in enumerate(self._rows):
                for e in entries:
                    by_width.setdefault(len(e.prefix), []).append((row, e))
            self._tables = [self._build(by_width[width], width) for width in sorted(by_width)]
            self._dirty = False
        return self._tables

    def _build(self, flat: list[tuple[int, Entry]], width: int) -> EntryTable:
        def tensor(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

        return EntryTable(
            slot=tensor([row for row, _ in flat], torch.int64),
            token=tensor([e.token for _, e in flat], torch.int64),
            value=tensor([e.value for _, e in flat], torch.float32),
            min_tokens=tensor([e.min_tokens for _, e in flat], torch.int64),
            prefix=tensor([list(e.prefix) for _, e in flat], torch.int64).view(len(flat), width),
            has_min_tokens=any(e.min_tokens > 0 for _, e in flat),
            has_prefix=width > 0,
        )
