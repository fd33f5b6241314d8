"""Rows grouped into consecutive per-request segments, described by ``cu_num_rows`` [n+1].

Request ``i`` owns rows ``cu[i]:cu[i+1]``. Everything here is sync-free on the device: the
number of rows is known on the host (it is the logits' first dimension).
"""

from __future__ import annotations

import torch


def segment_rows(cu_num_rows: torch.Tensor, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(request [N], offset [N]) int64: each row's request index and its position inside the request."""
    rows = torch.arange(num_rows, device=cu_num_rows.device)
    request = torch.searchsorted(cu_num_rows[1:], rows, right=True)  # requests that end at or before the row
    return request, rows - cu_num_rows[request]


def max_rows_bound(cu_num_rows: torch.Tensor, num_rows: int) -> int:
    """A host-side upper bound on the rows of one request.

    Exact when ``cu_num_rows`` is on the CPU (reading it is free); on an accelerator
    ``num_rows - n + 1`` (every request has at least one row), which needs no device sync.
    """
    num_requests = cu_num_rows.shape[0] - 1
    if cu_num_rows.device.type == "cpu":
        return int((cu_num_rows[1:] - cu_num_rows[:-1]).max()) if num_requests else 1
    return max(num_rows - num_requests + 1, 1)
