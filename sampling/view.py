"""`RowView`: the logits rows of one step, as the pipeline stages see them.

Row ``r`` scores the next token of batch slot ``slots[r]`` as if the ``offsets[r]`` drafts
before it in its request had already been generated: its output position, token counts
and token history include them. A plain step (`RowView.of`) has one row per slot and no
drafts; `RowView.with_drafts` expands each request into its k+1 verification rows.
Nothing here copies the batch's [R, V] state beyond the rows gathered, and nothing
reads the device from the host.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from sampling.batch import RowParams, SamplingBatch
from sampling.ops.segments import segment_rows


@dataclass(frozen=True)
class RowView:
    """N rows; every tensor is [N] int64 on the batch's device unless stated."""

    batch: SamplingBatch
    slots: torch.Tensor
    """The batch slot of each row."""
    requests: torch.Tensor
    """The index of each row's request in this step's ``rows``."""
    offsets: torch.Tensor
    """Drafts of the same request before this row (0 without drafts)."""
    drafts: torch.Tensor | None
    """The draft token verified at each row (-1 at each request's last row); None: no drafts."""
    max_rows_per_request: int
    """Host-side upper bound on the rows of one request (1 without drafts)."""
    params: RowParams
    """Per-row parameters; ``output_pos`` includes ``offsets``."""

    @classmethod
    def of(cls, batch: SamplingBatch, rows: torch.Tensor) -> RowView:
        """One row per slot of ``rows`` ([n] int64, distinct), no drafts."""
        n = rows.shape[0]
        index = torch.arange(n, device=rows.device)
        return cls(batch, rows, index, torch.zeros_like(index), None, 1, batch.gather(rows))

    def with_drafts(self, draft_token_ids: torch.Tensor, cu_num_rows: torch.Tensor, max_rows_per_request: int) -> RowView:
        """Expand each request ``i`` of this view into rows ``cu[i]:cu[i+1]``, row ``cu[i] + j`` verifying
        ``draft_token_ids[cu[i] + j]`` after the drafts ``cu[i]:cu[i] + j``.

        draft_token_ids: [N] int64, -1 at each request's last row. cu_num_rows: [n+1] int64 on the device.
        max_rows_per_request: a host-side upper bound on ``cu[i+1] - cu[i]`` (`max_rows_bound`).
        """
        requests, offsets = segment_rows(cu_num_rows, draft_token_ids.shape[0])
        slots = self.slots[requests]
        params = self.batch.gather(slots)
        params = dataclasses.replace(params, output_pos=params.output_pos + offsets)
        return RowView(self.batch, slots, requests, offsets, draft_token_ids, max_rows_per_request, params)

    @property
    def first_rows(self) -> torch.Tensor:
        """[N] the first row of each row's request."""
        return torch.arange(self.slots.shape[0], device=self.slots.device) - self.offsets

    # ---- stage inputs ---------------------------------------------------------------------------

    def allowed(self) -> torch.Tensor:
        """[N, V] bool ``allowed_token_ids`` mask."""
        assert self.batch.allowed is not None
        return self.batch.allowed[self.slots]

    def output_counts_at(self, tokens: torch.Tensor) -> torch.Tensor:
        """[N, L] int32: times each of ``tokens`` ([N, L] int64, >= 0) was generated, the drafts before the row included."""
        assert self.batch.output_counts is not None
        counts = self.batch.output_counts[self.slots[:, None], tokens]
        if self.drafts is None:
            return counts
        num_rows = self.slots.shape[0]
        j = torch.arange(self.max_rows_per_request, device=self.slots.device)
        source = (self.first_rows[:, None] + j).clamp(max=num_rows - 1)  # [N, J] rows of the request
        earlier = j < self.offsets[:, None]  # ... that come before the row
        drafts = torch.where(earlier, self.drafts[source], torch.full_like(source, -1))
        return counts + (tokens[:, :, None] == drafts[:, None, :]).sum(dim=-1, dtype=counts.dtype)

    def history(self) -> torch.Tensor:
        """[N, L] int64 tokens (prompt, outputs, then the drafts before the row), -1 past the end."""
        assert self.batch.history is not None
        positions = torch.arange(self.batch.history.shape[1], device=self.slots.device)[None, :]
        return self._with_drafts(self.batch.history[self.slots], positions)

    def history_len(self) -> torch.Tensor:
        """[N] length of `history` (capped at its width)."""
        assert self.batch.history is not None
        return self._unclamped_history_len().clamp(max=self.batch.history.shape[1])

    def dry_breaker_mask(self, rows: torch.Tensor) -> torch.Tensor:
        """[n, V] bool: the DRY sequence-breaker tokens of ``rows`` ([n] int64 rows of this view)."""
        assert self.batch.dry_breaker_mask is not None
        return self.batch.dry_breaker_mask[self.slots[rows]]

    def last_outputs(self, width: int) -> torch.Tensor:
        """[N, width] int64: the row's last ``width`` output tokens (drafts included), oldest first;
        -1 where there are fewer outputs."""
        history, history_len = self.batch.history, self.batch.history_len
        assert history is not None and history_len is not None
        end = self._unclamped_history_len()[:, None]
        positions = end - width + torch.arange(width, device=end.device)
        tokens = history[self.slots[:, None], positions.clamp(0, history.shape[1] - 1)]
        tokens = self._with_drafts(tokens, positions)
        first_output = (history_len - self.batch.output_pos)[self.slots][:, None]
        return torch.where(positions >= first_output, tokens, torch.full_like(tokens, -1))

    def rows_of_slots(self, slots: torch.Tensor) -> torch.Tensor:
        """[E, max_rows_per_request] int64: the rows of each of ``slots`` [E], -1 padded (all -1 when the
        slot is not sampled this step)."""
        num_slots = self.batch.max_num_rows
        first = torch.full((num_slots,), -1, dtype=torch.int64, device=self.slots.device)
        first[self.slots] = self.first_rows  # every row of a slot writes the same value
        count = torch.zeros(num_slots, dtype=torch.int64, device=self.slots.device)
        count.index_add_(0, self.slots, torch.ones_like(self.slots))
        j = torch.arange(self.max_rows_per_request, device=self.slots.device)
        rows = first[slots][:, None] + j
        return torch.where(j < count[slots][:, None], rows, torch.full_like(rows, -1))

    # ---- helpers ----------------------------------------------------------------------------------

    def _unclamped_history_len(self) -> torch.Tensor:
        assert self.batch.history_len is not None
        return self.batch.history_len[self.slots] + self.offsets

    def _with_drafts(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """[N, K] ``tokens`` read from the batch history at ``positions`` ([N, K] or [1, K]), with the
        positions at and after the slot's history length replaced by the drafts before the row (-1 past them)."""
        if self.drafts is None:
            return tokens
        assert self.batch.history_len is not None
        draft_index = positions - self.batch.history_len[self.slots][:, None]
        source = (self.first_rows[:, None] + draft_index).clamp(0, self.slots.shape[0] - 1)
        is_draft = (draft_index >= 0) & (draft_index < self.offsets[:, None])
        past_end = draft_index >= self.offsets[:, None]
        return torch.where(is_draft, self.drafts[source], tokens.masked_fill(past_end, -1))
