"""Beam-search requests in the engine: one scheduled sequence per live beam, forked copy-on-write.

A search of width ``W`` takes ``W`` sampling rows when it starts (one for its prompt, the rest
kept for the beams it forks) and gives them back when it ends. Each round, every live beam's
sequence computes its next-token distribution (`engine.beam.rows.candidate_tensors`: the model's log-softmax,
``allowed_token_ids`` applied, top ``2W``); once all have, `engine.beam.search.advance` picks
the next beams. A beam continued once keeps its sequence and appends the token; each further
continuation is a fork that shares its blocks (`BlockManager.fork`); a beam not continued is
freed at once, and the search's end or abort frees them all.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from engine.beam.rows import BeamRows
from engine.beam.search import BeamSpec, Candidates, advance, best
from engine.outputs import EngineOutput, FinishReason, Hypothesis, RequestError
from engine.request import Request
from engine.scheduler import ScheduledStep, Scheduler
from sampling.device_copy import to_device
from sampling.params import SamplingParams

if TYPE_CHECKING:
    from engine.model_runner import ModelRunner

BEAM_ROW_PARAMS = SamplingParams(temperature=0.0, max_tokens=None, num_speculative_tokens=0)
"""A beam sequence's own sampling row: greedy and unbounded (its token is not used; the search stops it)."""


@dataclass(eq=False)
class BeamGroup:
    """One beam-search request: ``sequences[i]`` runs ``beams[i]``."""

    request_id: str
    spec: BeamSpec
    prompt_token_ids: list[int]
    allowed_bias: torch.Tensor | None
    """[V] on the device: 0 at ``allowed_token_ids``, -inf elsewhere (None: every token)."""
    sequences: list[Request] = field(default_factory=list)
    beams: list[Hypothesis] = field(default_factory=list)
    finished: list[Hypothesis] = field(default_factory=list)
    reports: dict[int, Candidates] = field(default_factory=dict)
    """Next-token candidates of this round, by ``id`` of the sequence."""
    spare_slots: list[int] = field(default_factory=list)
    num_forks: int = 0

    def ready(self) -> bool:
        return all(id(sequence) in self.reports for sequence in self.sequences)


class BeamGroups:
    """The engine's beam searches: started when ``W`` rows are free (and the searches' rows stay within
    ``max_rows``), advanced as their rounds complete."""

    def __init__(self, scheduler: Scheduler, runner: ModelRunner, eos_token_ids: tuple[int, ...], max_model_len: int, max_rows: int) -> None:
        """``max_rows``: the most sampling rows the engine's running searches hold together (their widths)."""
        self.scheduler = scheduler
        self.max_rows = max_rows
        self.num_rows = 0
        self.runner = runner
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.groups: dict[str, BeamGroup] = {}
        self.sequence_groups: dict[Request, BeamGroup] = {}
        """The search each live beam sequence runs a beam of."""
        self.waiting: deque[BeamGroup] = deque()
        self.reported: dict[str, BeamGroup] = {}

    def add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, vocab_size: int) -> None:
        """Queue a search (checked by the caller, `engine.beam.params.check_beam_params` included)."""
        bias = None
        if params.allowed_token_ids is not None:
            bias = torch.full((vocab_size,), -torch.inf)
            bias[params.allowed_token_ids] = 0.0
            bias = to_device(bias, self.runner.device)
        spec = BeamSpec.of(params, len(prompt_token_ids), self.max_model_len, self.eos_token_ids)
        group = BeamGroup(request_id, spec, list(prompt_token_ids), bias, beams=[Hypothesis((), 0.0)])
        self.groups[request_id] = group
        self.waiting.append(group)

    def start_waiting(self) -> None:
        """Start queued searches, in order, while the scheduler has ``W`` free rows for the next and ``max_rows`` allows them."""
        free = self.scheduler.free_slots
        while self.waiting and len(free) >= self.waiting[0].spec.width and self.num_rows + self.waiting[0].spec.width <= self.max_rows:
            group = self.waiting.popleft()
            self.num_rows += group.spec.width
            root = Request(group.request_id, group.prompt_token_ids, BEAM_ROW_PARAMS)
            self.sequence_groups[root] = group
            root.slot = free.pop()
            group.spare_slots = [free.pop() for _ in range(group.spec.width - 1)]
            self.runner.add_request(root)
            group.sequences.append(root)
            self.scheduler.add(root)

    def group_of(self, sequence: Request) -> BeamGroup | None:
        """The search ``sequence`` runs a beam of; None for any other request (or a beam freed)."""
        return self.sequence_groups.get(sequence)

    def plan_rows(self, step: ScheduledStep) -> BeamRows | None:
        """The beam sequences sampled in ``step`` and their rows, for the model runner (None: the step has none)."""
        sequences, indices, groups, first = [], [], [], 0
        for request, drafts in zip(step.sampled, step.draft_token_ids):
            group = self.sequence_groups.get(request)
            if group is not None:
                sequences.append(request)
                indices.append(step.logits_indices[first])
                groups.append(group)
            first += 1 + len(drafts)
        if not sequences:
            return None
        return BeamRows(sequences, indices, [group.allowed_bias for group in groups], max(group.spec.num_candidates for group in groups))

    def report(self, sequence: Request, candidates: Candidates | None) -> None:
        """A beam's next-token candidates from the step just collected."""
        group = self.sequence_groups[sequence]
        assert candidates is not None
        group.reports[id(sequence)] = candidates
        self.reported[group.request_id] = group

    def advance_reported(self) -> list[EngineOutput]:
        """Run the round of every search whose beams all reported; the outputs of those that ended."""
        outputs = []
        for group in self.reported.values():
            if group.request_id not in self.groups or not group.ready():
                continue
            try:
                output = self._advance(group)
            except (MemoryError, torch.OutOfMemoryError):
                raise
            except Exception as error:
                output = self.finish(group, FinishReason.ERROR)
                output.error = RequestError(f"the engine failed on this beam search ({type(error).__name__}: {error})", client_fault=False)
            if output is not None:
                outputs.append(output)
        self.reported.clear()
        return outputs

    def _advance(self, group: BeamGroup) -> EngineOutput | None:
        candidates = [group.reports[id(sequence)] for sequence in group.sequences]
        group.reports.clear()
        round_ = advance(group.spec, group.beams, candidates, group.finished)
        group.finished = round_.finished
        if round_.done:
            return self.finish(group, FinishReason.STOP)
        parents = group.sequences
        children: dict[int, list[Hypothesis]] = {}
        for index, hypothesis in round_.beams:
            children.setdefault(index, []).append(hypothesis)
        for index, parent in enumerate(parents):
            if index not in children:
                self._free(group, parent)
        sequences = []
        for index, hypotheses in children.items():
            parent = parents[index]
            for hypothesis in hypotheses[1:]:
                sequences.append(self._fork(group, parent, hypothesis.token_ids[-1]))
            parent.output_token_ids.append(hypotheses[0].token_ids[-1])
            sequences.append(parent)
        group.sequences = sequences
        group.beams = [hypothesis for hypotheses in children.values() for hypothesis in (*hypotheses[1:], hypotheses[0])]
        return None

    def _fork(self, group: BeamGroup, parent: Request, token_id: int) -> Request:
        """A new sequence: the parent's tokens and ``token_id``, sharing the parent's blocks."""
        group.num_forks += 1
        child = Request(f"{group.request_id}#beam{group.num_forks}", group.prompt_token_ids, BEAM_ROW_PARAMS, [*parent.output_token_ids, token_id])
        self.sequence_groups[child] = group
        child.slot = group.spare_slots.pop()
        self.runner.add_request(child)
        self.scheduler.blocks.fork(parent, child)
        if parent in self.scheduler.running:
            self.scheduler.running.append(child)
        else:  # preempted after it reported: recomputed like its parent
            self.scheduler.waiting.appendleft(child)
        return child

    def _free(self, group: BeamGroup, sequence: Request) -> None:
        """Drop a beam's sequence: its blocks to the pool, its row to the search's spares."""
        sequence.finished = True
        del self.sequence_groups[sequence]
        slot, sequence.slot = sequence.slot, None
        assert slot is not None
        self.runner.remove_request(slot)
        self.scheduler.remove(sequence)
        group.spare_slots.append(slot)

    def finish(self, group: BeamGroup, reason: FinishReason) -> EngineOutput:
        """End a search (done, aborted or failed): free its sequences and rows; its final output.

        ``beams``: the ``W`` best hypotheses when it is done; otherwise ``W`` empty ones ending with ``reason``.
        """
        for sequence in group.sequences:
            self._free(group, sequence)
        group.sequences = []
        del self.groups[group.request_id]
        if group in self.waiting:
            self.waiting.remove(group)
        else:
            self.num_rows -= group.spec.width
        self.scheduler.free_slots += group.spare_slots
        group.spare_slots = []
        width = group.spec.width
        beams = best(group.spec, group.finished) if reason == FinishReason.STOP else [Hypothesis((), 0.0, (), reason)] * width
        return EngineOutput(group.request_id, [], len(group.prompt_token_ids), reason, beams=beams)
