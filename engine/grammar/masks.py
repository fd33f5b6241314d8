"""`MaskFiller`: the host side of the grammar mask handshake.

Each step, the engine hands the constrained requests' matchers (with the drafts each will
verify) to `MaskFiller.start`, which fills their next-token bitmasks on a worker thread with
llguidance's parallel executor (native code, no Python loop over the vocabulary) while the
engine thread launches the forward pass; the model runner waits for the bitmasks just before
the sampler. A request's row ``j`` gets the mask after its first ``j`` drafts: llguidance walks
the drafts and rolls the matcher back, so the matcher stays at the accepted tokens, which the
engine feeds it (`advance`) when the step's results are in.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

import llguidance
import llguidance.numpy
import numpy as np
import torch


class GrammarStepError(ValueError):
    """The request's matcher failed on a token its own mask allowed: its grammar passed one of
    llguidance's per-step limits (Earley items, lexer fuel), a fault of the request's grammar."""


class ConstrainedRows(NamedTuple):
    """One constrained request's rows in a step: a row for its next token, then one per draft."""

    matcher: llguidance.LLMatcher
    first_row: int
    """Its first logits row in the step."""
    drafts: list[int]


@dataclass
class PendingMasks:
    """Bitmasks being filled for one step: ``rows`` [M] are the logits rows (in step order) they belong to."""

    bitmask: Future[torch.Tensor]
    """[M, ceil(V / 32)] int32 on the host when done."""
    rows: list[int]


class MaskFiller:
    def __init__(self, vocab_size: int) -> None:
        self._words = (vocab_size + 31) // 32
        self._executor = llguidance.LLExecutor()  # its threads: most of the CPUs, up to 32
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-masks")

    def start(self, requests: list[ConstrainedRows]) -> PendingMasks:
        """Start filling the bitmasks of every row of ``requests``."""
        rows = [r.first_row + j for r in requests for j in range(len(r.drafts) + 1)]
        return PendingMasks(self._worker.submit(self._fill, requests, len(rows)), rows)

    def _fill(self, requests: list[ConstrainedRows], num_rows: int) -> torch.Tensor:
        bitmask = np.full((num_rows, self._words), -1, dtype=np.int32)  # rows after an invalid draft stay open; never emitted
        plain, drafted, index = [], [], 0
        for matcher, _, drafts in requests:
            if drafts:
                drafted.append((matcher, index, drafts))
            else:
                plain.append((matcher, index))
            index += len(drafts) + 1
        if plain:
            llguidance.numpy.fill_next_token_bitmask_par(self._executor, plain, bitmask)
        if drafted:  # llguidance takes only non-empty drafts here
            llguidance.numpy.fill_next_token_bitmask_par_with_draft_tokens(self._executor, drafted, bitmask)
        return torch.from_numpy(bitmask)


def advance(matcher: llguidance.LLMatcher, token_ids: list[int]) -> None:
    """Feed the request's accepted tokens to its matcher; raises `GrammarStepError` if it fails."""
    if not matcher.consume_tokens(token_ids):
        raise GrammarStepError(f"the grammar is too complex for this server's grammar limits: {matcher.get_error()}")
