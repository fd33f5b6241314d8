"""Continuous batching: which tokens of which requests run in the next step."""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.fair_share import HEAD_KEY, FairShare, QueueKey, SchedulingPolicy
from engine.kv.block_manager import BlockCopy, BlockManager
from engine.models.attention_metadata import ScheduledChunk
from engine.request import Request

PrefixLimit = Callable[[Request], int | None]
"""A feature's bound on the leading positions of a sequence that the prefix cache may supply, those
past it needing their logits (`PromptLogprobsRequests.prefix_limit`); None: no bound."""


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
    block_copies: list[BlockCopy] = field(default_factory=list)
    """Copy-on-write copies of KV blocks to run before the step's forward pass."""


class Scheduler:
    """FIFO admission under a per-step token budget, ``max_num_seqs`` sampling rows and a pool of KV blocks.

    Decodes are scheduled first (one token each, plus their drafts), then prefill chunks
    of running requests, then waiting requests as rows and blocks allow, their prompts
    chunked to fit; a new request first takes the cached blocks its prompt starts with. A
    request with guidance holds two rows and two block tables, and its companion completes
    its sequence in the same step as the request, never in another.

    Blocks are reserved for the positions a step computes. When the pool runs short, a running
    sequence with nothing to compute (a beam whose search waits for its other beams) is
    preempted first, whoever needs the blocks; then the youngest running request not yet in
    the step (younger than the one that needs blocks) is: its blocks are released and it goes
    back to the head of the queue, keeping its sampling row, to recompute its prompt and output so far. With none left,
    the request that needs blocks is preempted itself, or, when it needs more blocks than
    the whole pool holds, listed in ``too_large`` for the engine to finish.

    Under `SchedulingPolicy.PRIORITY` the queue is ordered by `engine.fair_share` (priority, then
    turns between clients, then arrival) and preempted requests go back to their place in it; running
    requests are scheduled in that order; a running request that needs blocks preempts the running
    request that comes last in that order after it; before each step, running requests of a lower
    priority (a larger value) than the queue's head are preempted until the pool holds the head.
    """

    def __init__(
        self,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        blocks: BlockManager,
        max_constrained: int | None = None,
        prefix_limit: PrefixLimit | None = None,
        policy: SchedulingPolicy = SchedulingPolicy.FCFS,
    ) -> None:
        """``max_constrained``: the most requests with a grammar holding sampling rows at once (None: any number)."""
        self.prefix_limit = prefix_limit
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_constrained = max_num_seqs if max_constrained is None else max_constrained
        self.num_constrained = 0
        """Requests with a grammar holding a sampling row (running, or preempted and queued)."""
        self.max_model_len = max_model_len
        self.blocks = blocks
        self.free_slots = list(range(max_num_seqs - 1, -1, -1))
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.too_large: list[Request] = []
        self.num_preemptions = 0
        self._preempted_this_step: set[int] = set()
        self.fair_share = FairShare() if policy is SchedulingPolicy.PRIORITY else None

    def add(self, request: Request) -> None:
        if self.fair_share is None:
            self.waiting.append(request)
            return
        request.queue_key = self.fair_share.key(request.params.priority, request.client)
        self._enqueue(request)

    def _enqueue(self, request: Request) -> None:
        """Into its place in the queue under the priority policy."""
        self.waiting.insert(bisect.bisect_right(self.waiting, _queue_key(request), key=_queue_key), request)

    def remove(self, request: Request) -> None:
        """Take a finished or aborted request out; its rows and blocks are free for the next step."""
        if request in self.running:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        if self.fair_share is not None and request.queue_key is not None:
            self.fair_share.released(request.queue_key)
            request.queue_key = None
        if request.grammar is not None and request.slot is not None:
            self.num_constrained -= 1
        for holder in request.sequences:
            self.blocks.release(holder)
            if holder.slot is not None:
                self.free_slots.append(holder.slot)
                holder.slot = None

    def schedule(self, admit: Callable[[Request], bool]) -> ScheduledStep:
        """The next step. ``admit`` is called for each request given its slots; when it returns
        False the request was failed (and removed) and is not scheduled."""
        step = ScheduledStep()
        budget = self.max_num_batched_tokens
        self._preempted_this_step.clear()
        if self.fair_share is not None:
            self._make_room_for_queue_head()
        # A request whose in-flight tokens already reach its limit waits for them to land.
        decoding = [r for r in self.running if _num_remaining(r) == 1 and r.room_to_grow(self.max_model_len) > 0]
        prefilling = [r for r in self.running if _num_remaining(r) > 1]
        if self.fair_share is not None:
            decoding.sort(key=_queue_key)
            prefilling.sort(key=_queue_key)
        for request in decoding + prefilling:
            if budget == 0:
                break
            if id(request) in self._preempted_this_step:
                continue
            if self._schedule_decode(step, request):
                budget -= 1
                continue
            budget -= self._schedule_request(step, request, budget, may_preempt=True) or 0
        self._schedule_waiting(step, admit, budget)
        step.block_copies = self.blocks.take_copies()
        return step

    def _make_room_for_queue_head(self) -> None:
        """Priority policy: preempt running requests of a lower priority than the queue's head (the
        last in queue order first) until the pool holds the head's tokens. A head that needs a row while
        none is free waits: a preempted request keeps its row."""
        if not self.waiting or self.waiting[0].num_placeholders:
            return
        head = self.waiting[0]
        if head.slot is None and len(self.free_slots) < len(head.sequences):
            return
        needed = sum(self.blocks.blocks_for(holder.num_tokens + 1) for holder in head.sequences)
        if needed > self.blocks.num_blocks:
            return
        priority = _queue_key(head)[0]
        while self.blocks.pool.num_available < needed:
            lower = [r for r in self.running if _queue_key(r)[0] > priority]
            if not lower:
                return
            self._preempt(max(lower, key=_queue_key))

    def _schedule_waiting(self, step: ScheduledStep, admit: Callable[[Request], bool], budget: int) -> None:
        """Admit queued requests in order (preempted ones first) while rows, blocks and budget last;
        new requests with a grammar past ``max_constrained`` stay queued, in order, behind those admitted."""
        passed: list[Request] = []
        try:
            self._admit_waiting(step, admit, budget, passed)
        finally:
            self.waiting.extendleft(reversed(passed))

    def _admit_waiting(self, step: ScheduledStep, admit: Callable[[Request], bool], budget: int, passed: list[Request]) -> None:
        while self.waiting and budget > 0:
            request = self.waiting[0]
            if request.num_placeholders:  # preempted while its last token was in flight; it lands next step
                return
            if self.fair_share is not None and id(request) in self._preempted_this_step:  # preempted for those before it
                return
            is_new = request.slot is None
            if is_new and request.grammar is not None and self.num_constrained >= self.max_constrained:
                passed.append(self.waiting.popleft())
                continue
            if is_new and len(self.free_slots) < len(request.sequences):
                return
            if sum(self.blocks.blocks_for(holder.num_tokens + 1) for holder in request.sequences) > self.blocks.num_blocks:
                self.too_large.append(request)  # the engine finishes it, taking it out of the queue
                return
            self.waiting.popleft()
            if is_new and self.fair_share is not None and request.queue_key is not None:
                self.fair_share.admitted(request.queue_key, request.client)
            num_hit = sum(self.blocks.match_prefix(holder, self.num_cacheable(holder)) for holder in request.sequences)
            self.running.append(request)
            if is_new:
                for holder in request.sequences:
                    holder.slot = self.free_slots.pop()
                self.num_constrained += request.grammar is not None
                if not admit(request):
                    continue
            used = self._schedule_request(step, request, budget, may_preempt=False)
            if used is None:  # the pool is short: wait for blocks, keeping the sampling rows
                self.running.pop()
                self._requeue(request)
                return
            self.blocks.stats.queried_tokens += sum(holder.num_tokens for holder in request.sequences)
            self.blocks.stats.hit_tokens += num_hit
            budget -= used

    def num_cacheable(self, sequence: Request) -> int:
        """Leading known tokens the prefix cache may supply: all but the last, whose logits are
        needed, and none past ``prefix_limit``'s bound."""
        bound = None if self.prefix_limit is None else self.prefix_limit(sequence)
        limit = sequence.num_tokens - 1
        return limit if bound is None else min(limit, bound)

    def _schedule_decode(self, step: ScheduledStep, request: Request) -> bool:
        """`_schedule_request` for the common case, a step's bulk: one token to decode, no drafts, no
        companion, its block at hand (else False, nothing done: the general path preempts or waits).
        The same step as the general path's: 1.0 ms of host time at 256 sequences where it took 1.4."""
        if request.guidance is not None or request.draft_token_ids or _num_remaining(request) != 1:
            return False
        if not self.blocks.reserve(request, request.num_computed_tokens + 1):
            return False
        row = _schedule_chunk(step, request, 1, [], request)
        self.blocks.register_full_blocks(request, min(request.num_computed_tokens + 1, request.num_tokens))
        step.sampled.append(request)
        step.draft_token_ids.append([])
        step.logits_indices.extend(row)
        return True

    def _schedule_request(self, step: ScheduledStep, request: Request, budget: int, may_preempt: bool) -> int | None:
        """Schedule the request (and its companion) within ``budget``; return the tokens used, or
        None when the pool could not hold them (the request is then preempted, or requeued by the caller).

        Drafts are cut to fit. If the sequences cannot complete, both get prefill chunks
        that stop short of their last token, so that they complete together later.
        """
        holders = request.sequences
        remaining = sum(_num_remaining(holder) for holder in holders)
        num_drafts = min(len(request.draft_token_ids), max(budget - remaining, 0) // len(holders))
        del request.draft_token_ids[num_drafts:]
        completes = remaining <= budget
        plan: list[tuple[Request, int, list[int]]] = []
        for holder in holders:
            if completes:
                plan.append((holder, _num_remaining(holder), request.draft_token_ids))
            else:
                plan.append((holder, min(_num_remaining(holder) - 1, budget - sum(max(n, 0) for _, n, _ in plan)), []))
        if not self._reserve(step, request, plan, may_preempt):
            return None
        rows = []
        for holder, num_tokens, drafts in plan:
            rows.append(_schedule_chunk(step, holder, num_tokens, drafts, request))
            self.blocks.register_full_blocks(holder, min(holder.num_computed_tokens + max(num_tokens, 0), holder.num_tokens))
        if not completes:
            return sum(max(num_tokens, 0) for _, num_tokens, _ in plan)
        step.sampled.append(request)
        step.draft_token_ids.append(list(request.draft_token_ids))
        first_row = len(step.logits_indices)
        step.logits_indices.extend(rows[0])
        if request.guidance is not None:
            step.guided_rows.extend(range(first_row, len(step.logits_indices)))
            step.companion_logits_indices.extend(rows[1])
            step.guidance_scales.extend([request.guidance.scale] * len(rows[1]))
        return remaining + num_drafts * len(holders)

    def _reserve(self, step: ScheduledStep, request: Request, plan: list[tuple[Request, int, list[int]]], may_preempt: bool) -> bool:
        """Blocks for the planned chunks, preempting younger requests if allowed; False if they could not be had."""
        while not all(self.blocks.reserve(h, h.num_computed_tokens + n + len(d)) for h, n, d in plan if n > 0):
            victim = self._idle(step) or self._victim(step, request, may_preempt)
            if victim is not None:
                self._preempt(victim)
                continue
            if not may_preempt:
                return False
            needed = sum(self.blocks.blocks_for(h.num_computed_tokens + n + len(d)) for h, n, d in plan)
            if needed > self.blocks.num_blocks:
                self.too_large.append(request)
            else:
                self._preempt(request)
            return False
        return True

    def _idle(self, step: ScheduledStep) -> Request | None:
        """The youngest running sequence with nothing to compute (a beam waiting for the other beams
        of its search): its blocks go first, to anyone, or the search could wait for itself."""
        scheduled = {id(sequence) for sequence in step.requests}
        for candidate in reversed(self.running):
            if _num_remaining(candidate) == 0 and not candidate.num_placeholders and id(candidate) not in scheduled:
                return candidate
        return None

    def _victim(self, step: ScheduledStep, request: Request, may_preempt: bool) -> Request | None:
        """Whom ``request`` may preempt for blocks (the class docstring): None when no one."""
        if self.fair_share is None:
            return self._youngest_unscheduled(step, request) if may_preempt else None
        scheduled = {id(sequence) for sequence in step.requests}
        mine = _queue_key(request)
        candidates = [
            c for c in self.running if c is not request and id(c) not in scheduled and (_queue_key(c) > mine if may_preempt else _queue_key(c)[0] > mine[0])
        ]
        return max(candidates, key=_queue_key, default=None)

    def _youngest_unscheduled(self, step: ScheduledStep, request: Request) -> Request | None:
        """The youngest running request younger than ``request`` with nothing in the step yet."""
        scheduled = {id(sequence) for sequence in step.requests}
        for candidate in reversed(self.running):
            if candidate is request:
                return None
            if id(candidate) not in scheduled:
                return candidate
        return None

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self._requeue(request)
        self.num_preemptions += 1
        self._preempted_this_step.add(id(request))

    def _requeue(self, request: Request) -> None:
        """Release the request's blocks and put it at the head of the queue (its rows kept), to recompute."""
        for holder in request.sequences:
            self.blocks.release(holder)
        request.draft_token_ids = []
        if self.fair_share is None:
            self.waiting.appendleft(request)
        else:
            self._enqueue(request)


def _queue_key(request: Request) -> QueueKey:
    return HEAD_KEY if request.queue_key is None else request.queue_key


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
    chunk = ScheduledChunk(tuple(sequence.kv.block_ids), start, num_tokens + len(drafts), prompt_tokens=len(sequence.prompt_token_ids))
    step.chunks.append(chunk)
    if start == sequence.num_tokens:  # a decode whose input is still on the device
        assert num_tokens == 1 and not drafts
        step.placeholder_inputs.append((len(step.input_ids), owner))
        step.input_ids.append(0)
    else:
        step.input_ids.extend(sequence.token_ids(start, start + num_tokens))
    step.input_ids.extend(drafts)
    end = len(step.input_ids)
    return list(range(end - 1 - len(drafts), end))
