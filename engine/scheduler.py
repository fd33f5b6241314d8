"""Continuous batching: which tokens of which requests run in the next step."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from engine.models.attention_metadata import ScheduledChunk
from engine.request import Request


@dataclass
class ScheduledStep:
    """One flat batch: the requests' chunks back to back, in this order.

    sampled: the requests whose chunk completes their sequence, so they sample a
    token this step (in batch order); a request mid-prefill samples nothing.
    logits_indices: for each sampled request, its last token's index in the flat
    batch (``query_start_loc[1:] - 1`` restricted to the sampled requests).
    admitted: the requests given a slot this step.
    placeholder_inputs: (flat index, request) for decode inputs sampled by the step in
    flight, not yet on the host; the runner fills them on the device. Their
    ``input_ids`` entry is 0 meanwhile.
    """

    requests: list[Request]
    chunks: list[ScheduledChunk]
    input_ids: list[int]
    sampled: list[Request]
    logits_indices: list[int]
    admitted: list[Request]
    placeholder_inputs: list[tuple[int, Request]]


class Scheduler:
    """FIFO admission into ``max_num_seqs`` slots under a per-step token budget.

    Decodes are scheduled first (one token each), then prefill chunks of running
    requests, then waiting requests as slots free, their prompts chunked to fit.
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
        """Take a finished or aborted request out; its slot is free for the next step."""
        if request.slot is None:
            self.waiting.remove(request)
            return
        self.running.remove(request)
        self.free_slots.append(request.slot)
        request.slot = None

    def schedule(self) -> ScheduledStep:
        step = ScheduledStep(requests=[], chunks=[], input_ids=[], sampled=[], logits_indices=[], admitted=[], placeholder_inputs=[])
        budget = self.max_num_batched_tokens
        # A request whose in-flight tokens already reach its limit waits for them to land.
        decoding = [r for r in self.running if r.num_total_tokens - r.num_computed_tokens == 1 and r.may_grow(self.max_model_len)]
        prefilling = [r for r in self.running if r.num_total_tokens - r.num_computed_tokens > 1]
        for request in decoding + prefilling:
            if budget == 0:
                return step
            budget -= self._schedule_chunk(step, request, budget)
        while self.waiting and self.free_slots and budget > 0:
            request = self.waiting.popleft()
            request.slot = self.free_slots.pop()
            self.running.append(request)
            step.admitted.append(request)
            budget -= self._schedule_chunk(step, request, budget)
        return step

    @staticmethod
    def _schedule_chunk(step: ScheduledStep, request: Request, budget: int) -> int:
        start = request.num_computed_tokens
        num_tokens = min(request.num_total_tokens - start, budget)
        assert request.slot is not None
        step.requests.append(request)
        step.chunks.append(ScheduledChunk(slot=request.slot, position=start, num_tokens=num_tokens))
        if start == request.num_tokens:  # a decode whose input is still on the device
            step.placeholder_inputs.append((len(step.input_ids), request))
            step.input_ids.append(0)
        else:
            step.input_ids.extend(request.token_ids(start, start + num_tokens))
        if start + num_tokens == request.num_total_tokens:
            step.sampled.append(request)
            step.logits_indices.append(len(step.input_ids) - 1)
        return num_tokens
