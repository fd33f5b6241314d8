"""A model-free engine for `bench.egress_capacity`: tokens at a GPU's step rate, with no model work.

`SyntheticEngineCore` has the part of `engine.core.EngineCore`'s interface that
`deployments.engine_actor.EngineActor` uses. Each step gives every running request one token
and keeps a stand-in device busy for ``step_s`` (a sleep); it is scheduled as the engine
schedules on CUDA (``async_scheduling``, the default there): `step` launches a step and returns
the previous one's outputs once the device has finished it, so the host's work between steps
(publishing outputs, waiting for step credits) overlaps the next step's device time, and the
device starts a step when it finishes the previous one or when the host launches it, whichever
is later. Up to
``max_num_seqs`` run at once, the others wait; a request ends at its ``max_tokens`` (or the
context) with finish reason ``length``; a request that asks for ``logprobs`` gets made-up ones with as
many alternatives (real ids, so the ingress detokenizes each). `SyntheticEngineActor` is the real `EngineActor`
around it, so its mailboxes and step credits, and everything after them (the ingress's
output router, the detokenizer pool, the SSE path), run as they would behind a GPU.

The token ids are ordinary ids of a real vocabulary (never an EOS or control token of the
default model), a fixed function of the request and the position, so the detokenizer does
real work. Not part of the app: the benchmark creates the actor under the engine's name
before it deploys the app, and the ingress finds it by that name.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from dataclasses import dataclass

from deployments.engine_actor import EngineActor
from engine.config import EngineConfig
from engine.core import InvalidRequestError
from engine.kv.block_manager import PrefixCacheStats
from engine.outputs import EngineOutput, FinishReason
from sampling.params import SamplingParams
from sampling.token_logprobs import TokenLogprobs
from sampling.tokenized import TokenizedStrings

FIRST_TOKEN_ID = 1000
"""Ids from here on are ordinary text pieces in the default model's vocabulary (49,152)."""
TOKEN_ID_SPAN = 30000
FINISHED_COUNTS_KEPT = 65536


@dataclass(frozen=True)
class StepRate:
    """What the synthetic device does: ``max_num_seqs`` tokens every ``step_s`` seconds at most."""

    max_num_seqs: int
    step_s: float
    max_model_len: int = 4096

    @property
    def tokens_per_s(self) -> float:
        return self.max_num_seqs / self.step_s


@dataclass(frozen=True)
class _InFlight:
    """A launched step: its outputs and when the stand-in device finishes it."""

    outputs: list[EngineOutput]
    done_at: float


@dataclass
class _Sequence:
    seed: int
    num_prompt_tokens: int
    max_tokens: int
    num_logprobs: int | None = None
    generated: int = 0

    def next_token(self) -> int:
        self.generated += 1
        return self._token(self.generated)

    def logprobs(self) -> list[TokenLogprobs] | None:
        """The latest token's made-up logprob and ``num_logprobs`` alternatives (None: not asked for)."""
        if self.num_logprobs is None:
            return None
        top = [self._token(self.generated + 1 + k) for k in range(self.num_logprobs)]
        return [TokenLogprobs(-0.25, 1, top, [-0.25 - k for k in range(self.num_logprobs)])]

    def _token(self, position: int) -> int:
        return FIRST_TOKEN_ID + (self.seed * 7919 + position * 104729) % TOKEN_ID_SPAN


class SyntheticEngineCore:
    """`EngineCore`'s interface with a fixed step time and no model (see the module)."""

    def __init__(self, rate: StepRate) -> None:
        self.rate = rate
        self.max_model_len = rate.max_model_len
        self.requests: dict[str, _Sequence] = {}
        self.waiting: deque[str] = deque()
        self.running: list[str] = []
        self.pending_outputs: list[EngineOutput] = []
        self.in_flight: _InFlight | None = None
        self.finished_generated_counts: OrderedDict[str, int] = OrderedDict()
        self.prefix_cache_stats = PrefixCacheStats()
        self.num_generated_tokens = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.num_preemptions = 0

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_compiling(self) -> int:
        return 0  # no grammars

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or bool(self.pending_outputs) or self.in_flight is not None

    def num_generated(self, request_id: str) -> int:
        if request_id in self.requests:
            return self.requests[request_id].generated
        return self.finished_generated_counts[request_id]

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        strings: TokenizedStrings | None = None,
        client: str = "",
        client_id: str | None = None,
    ) -> None:
        if not prompt_token_ids or len(prompt_token_ids) >= self.max_model_len:
            raise InvalidRequestError(f"the prompt has {len(prompt_token_ids)} tokens; the context holds {self.max_model_len}")
        if request_id in self.requests:
            raise InvalidRequestError(f"request {request_id!r} is already running")
        room = self.max_model_len - len(prompt_token_ids)
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        self.requests[request_id] = _Sequence(sum(prompt_token_ids), len(prompt_token_ids), max_tokens, params.logprobs)
        self.waiting.append(request_id)

    def abort_requests(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            if request_id in self.requests:
                self.pending_outputs.append(self._finish(request_id, FinishReason.ABORT, []))

    def step(self) -> list[EngineOutput]:
        """Launch a step (one token for each running request); return the previous step's
        outputs, waiting for the device to finish that step."""
        launched = time.monotonic()
        tokens = self._tokens()
        ready, self.in_flight = self.in_flight, None
        if tokens:
            device_free = launched if ready is None else max(launched, ready.done_at)
            self.in_flight = _InFlight(tokens, device_free + self.rate.step_s)
        outputs = []
        if ready is not None:
            time.sleep(max(0.0, ready.done_at - time.monotonic()))
            outputs = ready.outputs
        outputs, self.pending_outputs = outputs + self.pending_outputs, []
        return outputs

    def _tokens(self) -> list[EngineOutput]:
        """One token for each running request, after admitting waiting ones up to ``max_num_seqs``."""
        outputs = []
        self.running = [r for r in self.running if r in self.requests]
        self.waiting = deque(r for r in self.waiting if r in self.requests)
        while self.waiting and len(self.running) < self.rate.max_num_seqs:
            self.running.append(self.waiting.popleft())
        for request_id in self.running:
            sequence = self.requests[request_id]
            token = [sequence.next_token()]
            self.num_generated_tokens += 1
            if sequence.generated >= sequence.max_tokens:
                output = self._finish(request_id, FinishReason.LENGTH, token)
            else:
                output = EngineOutput(request_id, token, sequence.num_prompt_tokens)
            output.logprobs = sequence.logprobs()
            outputs.append(output)
        self.running = [r for r in self.running if r in self.requests]
        return outputs

    def _finish(self, request_id: str, reason: FinishReason, new_token_ids: list[int]) -> EngineOutput:
        sequence = self.requests.pop(request_id)
        self.finished_generated_counts[request_id] = sequence.generated
        if len(self.finished_generated_counts) > FINISHED_COUNTS_KEPT:
            self.finished_generated_counts.popitem(last=False)
        return EngineOutput(request_id, new_token_ids, sequence.num_prompt_tokens, finish_reason=reason)


class SyntheticEngineActor(EngineActor):
    """The real `EngineActor` running a `SyntheticEngineCore` at ``rate``."""

    def __init__(self, rate: StepRate, max_waiting_requests: int) -> None:
        self.rate = rate
        super().__init__(EngineConfig(max_num_seqs=rate.max_num_seqs, max_model_len=rate.max_model_len), max_waiting_requests)

    def _load(self, config: EngineConfig) -> SyntheticEngineCore:  # type: ignore[override]
        return SyntheticEngineCore(self.rate)
