"""Continuous batching: which tokens of which requests run in the next step."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.models.attention_metadata import ScheduledChunk
from engine.request import Request


@dataclass
class ScheduledStep:
    """One flat batch: the chunks back to back, in this order.

    requests: the request of each chunk (guidance companions included).
    sampled: the requests whose chunk completes their sequence, so they sample this step
    (in batch order; never a companion); a request mid-prefill samples nothing.
    draft_token_ids: per sampled request, the drafted tokens its chunk ends with.
    logits_indices: per sampled request, the flat indices of its last ``1 + len(drafts)``
    tokens (the positions whose next token is sampled or verified), back to back.
    guided_rows: rows of ``logits_indices`` (in its order) whose request has guidance;
    companion_logits_indices: the flat indices of the companion's matching positions;
    guidance_scales: each guided row's scale.
    placeholder_inputs: (flat index, request) for decode inputs sampled by that request in
    the step in flight, not yet on the host; the runner fills them on the device. Their
    ``input_ids`` entry is 0 meanwhile.
    """

    requests: list[Request] = field(default_factory=list)
    chunks: list[ScheduledChunk] = field(default_factory=list)
    input_ids: list[int] = field(default_factory=list)
    sampled: list[Request] = field(default_factory=list)
    draft_token_ids: list[list[int]] = field(default_factory=list)
    logits_indices: list[int] = field(default_factory=list)
    guided_rows: list[int] = field(default_factory=list)
    companion_logits_indices: list[int] = field(default_factory=list)
    guidance_scales: list[float] = field(default_factory=list)
    placeholder_inputs: list[tuple[int, Request]] = field(default_factory=list)


class Scheduler:
    """FIFO admission into ``max_num_seqs`` slots under a per-step token budget.

    Decodes are scheduled first (one token each, plus their drafts), then prefill chunks
    of running requests, then waiting requests as slots free, their prompts chunked to
    fit. A request with guidance holds two slots, and its companion completes its
    sequence in the same step as the request, never in another.
    """

    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int) -> None:
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.free_slots = list(range(max_num_seqs - 1, -1, -1))
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def remove(self, request: Request) -> None:
        """Take a finished or aborted request out; its slots are free for the next step."""
        if request.slot is None:
            self.waiting.remove(request)
            return
        self.running.remove(request)
        for holder in request.sequences:
            assert holder.slot is not None
            self.free_slots.append(holder.slot)
            holder.slot = None

    def schedule(self, admit: Callable[[Request], bool]) -> ScheduledStep:
        """The next step. ``admit`` is called for each request given its slots; when it returns
        False the request was failed (and removed) and is not scheduled."""
        step = ScheduledStep()
        budget = self.max_num_batched_tokens
        # A request whose in-flight tokens already reach its limit waits for them to land.
        decoding = [r for r in self.running if _num_remaining(r) == 1 and r.room_to_grow(self.max_model_len) > 0]
        prefilling = [r for r in self.running if _num_remaining(r) > 1]
        for request in decoding + prefilling:
            if budget == 0:
                return step
            budget -= self._schedule_request(step, request, budget)
        while self.waiting and len(self.free_slots) >= len(self.waiting[0].sequences) and budget > 0:
            request = self.waiting.popleft()
            for holder in request.sequences:
                holder.slot = self.free_slots.pop()
            self.running.append(request)
            if not admit(request):
                continue
            budget -= self._schedule_request(step, request, budget)
        return step

    @staticmethod
    def _schedule_request(step: ScheduledStep, request: Request, budget: int) -> int:
        """Schedule the request (and its companion) within ``budget``; return the tokens used.

        Drafts are cut to fit. If the sequences cannot complete, both get prefill chunks
        that stop short of their last token, so that they complete together later.
        """
        holders = request.sequences
        remaining = sum(_num_remaining(holder) for holder in holders)
        num_drafts = min(len(request.draft_token_ids), max(budget - remaining, 0) // len(holders))
        del request.draft_token_ids[num_drafts:]
        if remaining > budget:
            used = 0
            for holder in holders:
                num_tokens = min(_num_remaining(holder) - 1, budget - used)
                _schedule_chunk(step, holder, num_tokens, [], request)
                used += max(num_tokens, 0)
            return used
        rows = [_schedule_chunk(step, holder, _num_remaining(holder), request.draft_token_ids, request) for holder in holders]
        step.sampled.append(request)
        step.draft_token_ids.append(list(request.draft_token_ids))
        first_row = len(step.logits_indices)
        step.logits_indices.extend(rows[0])
        if request.guidance is not None:
            step.guided_rows.extend(range(first_row, len(step.logits_indices)))
            step.companion_logits_indices.extend(rows[1])
            step.guidance_scales.extend([request.guidance.scale] * len(rows[1]))
        return remaining + num_drafts * len(holders)


def _num_remaining(request: Request) -> int:
    """Tokens of the sequence (drafts aside) whose keys and values are not in the cache yet."""
    return request.num_total_tokens - request.num_computed_tokens


def _schedule_chunk(step: ScheduledStep, sequence: Request, num_tokens: int, drafts: list[int], owner: Request) -> list[int]:
    """Append ``num_tokens`` of ``sequence`` then ``drafts``; return the flat indices of the last
    ``1 + len(drafts)`` tokens (used when the chunk completes the sequence), none if nothing was added.

    owner: the request whose sampled token a placeholder input waits for (the parent, for a companion).
    """
    if num_tokens <= 0:
        return []
    start = sequence.num_computed_tokens
    assert sequence.slot is not None
    step.requests.append(sequence)
    step.chunks.append(ScheduledChunk(slot=sequence.slot, position=start, num_tokens=num_tokens + len(drafts)))
    if start == sequence.num_tokens:  # a decode whose input is still on the device
        assert num_tokens == 1 and not drafts
        step.placeholder_inputs.append((len(step.input_ids), owner))
        step.input_ids.append(0)
    else:
        step.input_ids.extend(sequence.token_ids(start, start + num_tokens))
    step.input_ids.extend(drafts)
    end = len(step.input_ids)
    return list(range(end - 1 - len(drafts), end))
