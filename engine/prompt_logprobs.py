"""Prompt logprobs: which prefill rows go through the lm_head for them, their logprobs on the
device, and their return to the request that asked.

The state of each request that asked lives here (`PromptLogprobsRequests`), keyed by the request; the
step's rows reach the model runner as a `PromptRows` plan of the step the scheduler handed out.

A request with ``params.prompt_logprobs`` scores every prompt token after the first: the logits
at position p give the logprob of prompt token p + 1. Each prefill chunk (one per step when the
prompt is chunked) scores the positions it computes, so the first token of a chunk is scored by
the last row of the chunk before. Only these rows (and the sampled rows, as for every request)
go through the lm_head, a slice of rows at a time. A position is scored once: positions that
preemption makes a request recompute are not scored again, and the prefix cache gives such a
request no cached blocks past its first unscored position (their logits would be skipped).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.outputs import PromptLogprobs, TokenLogprobs
from engine.request import Request
from engine.scheduler import ScheduledStep
from sampling.device_copy import values_to_device
from sampling.logprobs import compute_prompt_logprobs

ROWS_PER_SLICE = 256
"""Prompt rows put through the lm_head at once: bounds the [rows, vocab] logits (50 MB for a
49152-token vocabulary in float32) whatever ``max_num_batched_tokens`` is."""


@dataclass
class PromptLogprobsState:
    """A request's prompt logprobs while its prompt is prefilled: ``num_top`` alternatives per token."""

    num_top: int
    num_scored_positions: int = 0
    """Positions [0, n) whose logits launched steps turn into the logprob of the token after them."""
    entries: list[TokenLogprobs] = field(default_factory=list)
    """Collected so far; ``entries[i]`` is prompt token i + 1's."""
    delivered: bool = False


@dataclass(frozen=True)
class PromptRows:
    """The prompt rows of one step, request after request.

    rows: flat indices into the step's tokens; next_token_ids: the prompt token each row scores;
    num_rows: per request, how many of the rows (consecutive, in this order) are its.
    """

    requests: list[Request]
    num_rows: list[int]
    rows: list[int]
    next_token_ids: list[int]
    num_top: int


@dataclass
class PromptLogprobsInFlight:
    """A step's prompt logprobs on their way to the host: token logprobs, ranks, top ids, top logprobs."""

    rows: PromptRows
    host: list[torch.Tensor]
    done: torch.cuda.Event | None


def launch_prompt_logprobs(
    plan: PromptRows, hidden: torch.Tensor, compute_logits: Callable[[torch.Tensor], torch.Tensor], pinned: bool
) -> PromptLogprobsInFlight:
    """hidden: [T, hidden] of the step -> the planned rows' logprobs, copying to the host (pinned: without waiting)."""
    rows = values_to_device(plan.rows, torch.int64, hidden.device)
    targets = values_to_device(plan.next_token_ids, torch.int64, hidden.device)
    parts = []
    for start in range(0, len(plan.rows), ROWS_PER_SLICE):
        logits = compute_logits(hidden[rows[start : start + ROWS_PER_SLICE]])
        parts.append(compute_prompt_logprobs(logits, targets[start : start + ROWS_PER_SLICE], plan.num_top))
    values = [torch.cat([getattr(p, name) for p in parts]) for name in ("token_logprobs", "token_ranks", "top_ids", "top_logprobs")]
    host = [torch.empty(v.shape, dtype=v.dtype, pin_memory=pinned) for v in values]
    for buffer, value in zip(host, values):
        buffer.copy_(value, non_blocking=pinned)
    done = torch.cuda.Event() if pinned else None
    if done is not None:
        done.record()
    return PromptLogprobsInFlight(plan, host, done)


class PromptLogprobsRequests:
    """The requests that asked for prompt logprobs (never a guidance companion or a beam), with their state."""

    def __init__(self) -> None:
        self.states: dict[Request, PromptLogprobsState] = {}

    def add(self, request: Request) -> None:
        """Score the request's prompt (it asked: ``params.prompt_logprobs`` is set)."""
        assert request.params.prompt_logprobs is not None
        self.states[request] = PromptLogprobsState(request.params.prompt_logprobs)

    def discard(self, request: Request) -> None:
        """Forget a finished request: rows of it still in flight are dropped when collected."""
        self.states.pop(request, None)

    def prefix_limit(self, sequence: Request) -> int | None:
        """The scheduler's `PrefixLimit`: no cached block past the first prompt position whose logits still score a prompt token."""
        state = self.states.get(sequence)
        if state is None or state.num_scored_positions >= len(sequence.prompt_token_ids) - 1:
            return None
        return state.num_scored_positions

    def plan(self, step: ScheduledStep) -> PromptRows | None:
        """The rows of ``step`` that score prompt tokens not scored before (None if none); marks them scored."""
        requests, num_rows, rows, next_token_ids = [], [], [], []
        offset = 0
        for sequence, chunk in zip(step.requests, step.chunks):
            state = self.states.get(sequence)
            if state is not None:
                start = max(chunk.position, state.num_scored_positions)
                end = min(chunk.position + chunk.num_tokens, len(sequence.prompt_token_ids) - 1)
                if end > start:
                    requests.append(sequence)
                    num_rows.append(end - start)
                    rows.extend(range(offset + start - chunk.position, offset + end - chunk.position))
                    next_token_ids.extend(sequence.prompt_token_ids[start + 1 : end + 1])
                    state.num_scored_positions = end
            offset += chunk.num_tokens
        if not requests:
            return None
        num_top = max(request.params.prompt_logprobs or 0 for request in requests)
        return PromptRows(requests, num_rows, rows, next_token_ids, num_top)

    def collect(self, in_flight: PromptLogprobsInFlight) -> None:
        """Wait for the copies; append each live request's entries (top-N cut to its own N) to its state."""
        if in_flight.done is not None:
            in_flight.done.synchronize()
        logprobs, ranks, top_ids, top_logprobs = (buffer.tolist() for buffer in in_flight.host)
        first = 0
        for request, count in zip(in_flight.rows.requests, in_flight.rows.num_rows):
            state = self.states.get(request)
            if state is not None:  # None: finished while the step ran
                num_top = state.num_top
                rows = range(first, first + count)
                state.entries += [TokenLogprobs(logprobs[r], ranks[r], top_ids[r][:num_top], top_logprobs[r][:num_top]) for r in rows]
            first += count

    def take(self, request: Request) -> PromptLogprobs | None:
        """The request's prompt logprobs, once (with its first output), if it asked for them."""
        state = self.states.get(request)
        if state is None or state.delivered:
            return None
        state.delivered = True
        entries, state.entries = state.entries, []
        return PromptLogprobs(list(request.prompt_token_ids), entries)
