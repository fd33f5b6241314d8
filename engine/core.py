"""`EngineCore`: add, abort and step requests on one model; no Ray, no text."""

from __future__ import annotations

import logging
from collections import OrderedDict

from engine.config import EngineConfig
from engine.loader.checkpoint import Checkpoint, load_checkpoint
from engine.model_runner import InFlightStep, ModelRunner
from engine.request import EngineOutput, FinishReason, Request, check_stop
from engine.scheduler import Scheduler
from sampling.params import SamplingParams

logger = logging.getLogger(__name__)

FINISHED_COUNTS_KEPT = 10_000


class InvalidRequestError(ValueError):
    """`add_request` refused the request; nothing else in the engine changed."""


class EngineCore:
    """Continuous batching over ``max_num_seqs`` slots.

    ``step()`` runs one flat batch and returns an `EngineOutput` for every request
    that produced tokens or finished (abort included) since the last step. A
    finished or aborted request's slot is free before the next step is scheduled.
    """

    def __init__(self, config: EngineConfig | None = None, checkpoint: Checkpoint | None = None) -> None:
        """``checkpoint``, if given, is used instead of loading ``config.model`` (tests share one)."""
        self.config = config or EngineConfig()
        checkpoint = checkpoint or load_checkpoint(self.config.model)
        self.model_config = checkpoint.config
        self.tokenizer = checkpoint.tokenizer
        self.max_model_len = min(self.config.max_model_len, checkpoint.config.max_position_embeddings)
        self.runner = ModelRunner(checkpoint, self.config, self.tokenizer.eos_token_ids)
        self.scheduler = Scheduler(self.config.max_num_seqs, self.config.max_num_batched_tokens, self.max_model_len)
        async_scheduling = self.config.async_scheduling
        self.async_scheduling = self.runner.device.type == "cuda" if async_scheduling is None else async_scheduling
        self.in_flight: InFlightStep | None = None
        self.requests: dict[str, Request] = {}
        self.pending_outputs: list[EngineOutput] = []
        self.num_generated_tokens = 0
        self.finished_generated_counts: OrderedDict[str, int] = OrderedDict()

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or bool(self.pending_outputs) or self.in_flight is not None

    def num_generated(self, request_id: str) -> int:
        """Tokens generated for a live or recently finished request."""
        if request_id in self.requests:
            return len(self.requests[request_id].output_token_ids)
        return self.finished_generated_counts[request_id]

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Queue one sequence; raises `InvalidRequestError` (and changes nothing) if it cannot run.

        ``params.n`` is not looked at: the ingress adds one engine request per choice.
        """
        self._validate(request_id, prompt_token_ids, params)
        request = Request(request_id=request_id, prompt_token_ids=list(prompt_token_ids), params=params)
        self.requests[request_id] = request
        self.scheduler.add(request)

    def _validate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        if not prompt_token_ids:
            raise InvalidRequestError("the prompt is empty")
        if len(prompt_token_ids) >= self.max_model_len:
            raise InvalidRequestError(
                f"the prompt has {len(prompt_token_ids)} tokens; the context holds {self.max_model_len}, "
                f"so at most {self.max_model_len - 1} prompt tokens leave room for output"
            )
        if params.prompt_logprobs is not None:
            raise InvalidRequestError("prompt_logprobs is not supported yet")
        if params.allowed_token_ids is not None and any(
            len(self.tokenizer.encode(text, add_special_tokens=False)) > 1 for word in params.bad_words for text in (word, f" {word}")
        ):
            # The sampler would find mid-generation that no token is left, failing the whole step.
            raise InvalidRequestError("allowed_token_ids cannot be combined with bad_words of more than one token")
        vocab_size = self.model_config.vocab_size
        bad = next((t for t in prompt_token_ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(f"prompt token id {bad} is outside the vocabulary [0, {vocab_size})")
        try:
            self.runner.validate(params, self.tokenizer.encode)
        except ValueError as error:
            raise InvalidRequestError(str(error)) from error

    def abort_requests(self, request_ids: list[str]) -> None:
        """Free the slots of these requests now; unknown or finished ids are ignored."""
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is not None:
                self.pending_outputs.append(self._finish(request, FinishReason.ABORT, None, new_token_ids=[]))

    def step(self) -> list[EngineOutput]:
        """Schedule and launch a step; return the outputs of the step whose results are in.

        Synchronous: that is this step. Asynchronous (default on CUDA): the previous one,
        collected after this one was launched, so the host's scheduling and stop checks
        overlap the device's work; a request that finished in the previous step may have
        one token computed in this step, which is discarded.
        """
        outputs, self.pending_outputs = self.pending_outputs, []
        step = self.scheduler.schedule()
        launched = None
        if step.requests:
            for request in step.admitted:
                self.runner.add_request(request, self.tokenizer.encode)
            launched = self.runner.launch(step, self.in_flight)
            for request, chunk in zip(step.requests, step.chunks):
                request.num_computed_tokens += chunk.num_tokens
            for request in step.sampled:
                request.num_placeholders += 1
        ready = launched
        if self.async_scheduling:
            ready, self.in_flight = self.in_flight, launched
        if ready is not None:
            outputs += self._collect(ready)
        return outputs

    def _collect(self, in_flight: InFlightStep) -> list[EngineOutput]:
        sampled_ids, logprobs = self.runner.collect(in_flight)
        outputs = []
        for index, (request, token_id) in enumerate(zip(in_flight.step.sampled, sampled_ids)):
            request.num_placeholders -= 1
            if request.finished:  # finished or aborted while this step ran
                continue
            output = self._append_token(request, token_id)
            if logprobs is not None and request.params.logprobs is not None:
                entry, num_top = logprobs[index], request.params.logprobs
                output.logprobs = [entry._replace(top_token_ids=entry.top_token_ids[:num_top], top_logprobs=entry.top_logprobs[:num_top])]
            outputs.append(output)
        self.num_generated_tokens += len(outputs)
        return outputs

    def _append_token(self, request: Request, token_id: int) -> EngineOutput:
        request.output_token_ids.append(token_id)
        stop = check_stop(request, self.tokenizer.eos_token_ids, self.max_model_len)
        if stop is None:
            return EngineOutput(request.request_id, [token_id], len(request.prompt_token_ids))
        return self._finish(request, *stop, new_token_ids=[token_id])

    def _finish(self, request: Request, reason: FinishReason, stop_reason: int | None, new_token_ids: list[int]) -> EngineOutput:
        """Free the request's slot; returns its final output.

        A launched step may still write this slot's cache and sampling row; a request
        admitted to the slot later only touches them in later, stream-ordered work.
        """
        request.finished = True
        if request.slot is not None:
            self.runner.remove_request(request.slot)
        self.scheduler.remove(request)
        del self.requests[request.request_id]
        self.finished_generated_counts[request.request_id] = len(request.output_token_ids)
        if len(self.finished_generated_counts) > FINISHED_COUNTS_KEPT:
            self.finished_generated_counts.popitem(last=False)
        return EngineOutput(request.request_id, new_token_ids, len(request.prompt_token_ids), reason, stop_reason)
