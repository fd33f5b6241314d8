"""`EngineCore`: add, abort and step requests on one model; no Ray, no text."""

from __future__ import annotations

import logging
from collections import OrderedDict

import torch

from engine.beam.groups import BeamGroups
from engine.beam.params import check_beam_params
from engine.config import EngineConfig, default_batched_tokens
from engine.fair_share import SchedulingPolicy
from engine.grammar.masks import advance
from engine.grammar.requests import ConstrainedRequests
from engine.grammar.spec import GrammarError
from engine.kv.block_manager import BlockManager, PrefixCacheStats
from engine.loader.checkpoint import Checkpoint, load_checkpoint
from engine.model_runner import InFlightStep, ModelRunner, SampledTokens
from engine.ngram_drafter import NgramIndex
from engine.outputs import EngineOutput, FinishReason, RequestError
from engine.prompt_logprobs import PromptLogprobsRequests
from engine.request import Guidance, Request, Stop, check_stop
from engine.scheduler import Scheduler
from sampling.params import SamplingParams
from sampling.tokenized import TokenizedStrings, has_strings

logger = logging.getLogger(__name__)

FINISHED_COUNTS_KEPT = 10_000
COMPILE_WAIT_S = 0.01
"""How long an otherwise idle step waits for a grammar to compile (instead of spinning; new requests wait as long)."""
ENGINE_FAULTS: tuple[type[BaseException], ...] = (MemoryError, torch.OutOfMemoryError, torch.AcceleratorError)
"""Failures that belong to no single request: raised out of `EngineCore.step`, never pinned on one."""
NO_TOKEN_LEFT = (
    "no token can be sampled: after the penalties every logit is -inf, or one is +inf "
    "(repetition_penalty, frequency_penalty, presence_penalty or DRY out of float32's range)"
)
"""Why a request fails whose penalties left no logit a token could be sampled by (the sampler emits -1)."""


class InvalidRequestError(ValueError):
    """`add_request` refused the request; nothing else in the engine changed."""


class EngineCore:
    """Continuous batching of up to ``max_num_seqs`` sequences over a paged KV cache.

    ``step()`` runs one flat batch and returns an `EngineOutput` for every request
    that produced tokens or finished (abort included) since the last step. A
    finished or aborted request's slot and blocks are free before the next step is
    scheduled. The context (``max_model_len``) is at most what the block pool holds.

    Work done for one request at a time (admission to the sampling batch, drafting,
    appending tokens, stop checks) that raises fails that request alone: it finishes
    with `FinishReason.ERROR` and the step goes on for the others. The batched forward
    pass and sampler cannot be pinned on one request (and `ENGINE_FAULTS` belong to no
    request): those exceptions leave ``step()``, and the engine must be replaced.
    """

    def __init__(self, config: EngineConfig | None = None, checkpoint: Checkpoint | None = None) -> None:
        """``checkpoint``, if given, is used instead of loading ``config.model`` (tests share one)."""
        self.config = config or EngineConfig()
        checkpoint = checkpoint or load_checkpoint(self.config.model)
        self.model_config = checkpoint.config
        self.tokenizer = checkpoint.tokenizer
        self.runner = ModelRunner(checkpoint, self.config, self.tokenizer.eos_token_ids)
        num_blocks = self.runner.kv_cache.num_blocks
        self.max_model_len = min(self.config.max_model_len, checkpoint.config.max_position_embeddings, num_blocks * self.config.block_size)
        blocks = BlockManager(num_blocks, self.config.block_size, self.config.enable_prefix_caching)
        config = self.config
        self.max_num_batched_tokens = config.max_num_batched_tokens or default_batched_tokens(self.runner.device.type, self.runner.prompt_tiles)
        self.prompt_logprobs = PromptLogprobsRequests()
        self.scheduler = Scheduler(
            config.max_num_seqs,
            self.max_num_batched_tokens,
            self.max_model_len,
            blocks,
            config.max_constrained_rows,
            self.prompt_logprobs.prefix_limit,
            config.scheduling_policy,
        )
        vocab_size = checkpoint.config.vocab_size
        self.constrained = ConstrainedRequests(self.tokenizer, vocab_size, config.grammar_cache_size, config.grammar_limits, config.compile_budget)
        self.beams = BeamGroups(self.scheduler, self.runner, self.tokenizer.eos_token_ids, self.max_model_len, config.max_beam_rows)
        async_scheduling = self.config.async_scheduling
        self.async_scheduling = self.runner.device.type == "cuda" if async_scheduling is None else async_scheduling
        self.in_flight: InFlightStep | None = None
        self.requests: dict[str, Request] = {}
        self.pending_outputs: list[EngineOutput] = []
        self.num_generated_tokens = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.finished_generated_counts: OrderedDict[str, int] = OrderedDict()

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        return self.scheduler.blocks.stats

    @property
    def num_preemptions(self) -> int:
        return self.scheduler.num_preemptions

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        """Requests queued to run; those waiting for their grammar to compile are not counted (the compile budget bounds them)."""
        return len(self.scheduler.waiting)

    @property
    def num_compiling(self) -> int:
        """Requests waiting for their grammar to compile."""
        return len(self.constrained.compiling)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or bool(self.beams.groups) or bool(self.pending_outputs) or self.in_flight is not None

    def num_generated(self, request_id: str) -> int:
        """Tokens generated for a live or recently finished request."""
        if request_id in self.requests:
            return len(self.requests[request_id].output_token_ids)
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
        """Queue one sequence; raises `InvalidRequestError` (and changes nothing) if it cannot run,
        `CompilesBusyError` (nothing changed) if its grammar is not cached and ``client`` (who sent
        it, as the caller knows them) or the engine already has as many grammars compiling as allowed.

        strings: the request's bad words, DRY breakers and negative prompt as ids, from
        `tokenize_strings` (the engine never tokenizes); None when it has none (`has_strings`).
        ``params.n`` is not looked at: the ingress adds one engine request per choice (choices with the
        same constraint share its compile). ``client_id`` (or else ``client``) is whose share of the
        queue the request takes under the priority policy (`engine.fair_share`). A request with ``structured_outputs`` is scheduled once
        its grammar has compiled on the worker; a grammar that does not compile, or not within the
        compile deadline, finishes it with `FinishReason.ERROR`.
        """
        if strings is None:
            if has_strings(params):
                raise InvalidRequestError("bad_words, DRY and negative_prompt need the request's TokenizedStrings (tokenize_strings)")
            strings = TokenizedStrings()
        self._validate(request_id, prompt_token_ids, params, strings)
        if params.use_beam_search:
            self.beams.add(request_id, prompt_token_ids, params, self.model_config.vocab_size)
            return
        try:
            request = self._build(request_id, prompt_token_ids, params, strings)
            request.client = client_id or client
        except (InvalidRequestError, *ENGINE_FAULTS):
            raise
        except Exception as error:
            raise InvalidRequestError(f"the request could not be set up: {error}") from error
        try:
            compiling = params.structured_outputs is not None and self.constrained.submit(request, client)
        except GrammarError as error:  # compiled too slowly before
            raise InvalidRequestError(str(error)) from error
        self.requests[request_id] = request
        if not compiling:
            self.scheduler.add(request)

    def _build(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, strings: TokenizedStrings) -> Request:
        request = Request(request_id=request_id, prompt_token_ids=list(prompt_token_ids), params=params, strings=strings)
        if self._num_speculative_tokens(params) > 0:
            min_n = params.prompt_lookup_min or self.config.prompt_lookup_min
            request.ngram_index = NgramIndex(min_n, max(min_n, params.prompt_lookup_max or self.config.prompt_lookup_max))
        if params.guidance_scale != 1.0:
            request.guidance = self._guidance(request)
        if params.prompt_logprobs is not None:
            self.prompt_logprobs.add(request)
        return request

    def _validate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, strings: TokenizedStrings) -> None:
        if request_id in self.requests or request_id in self.beams.groups:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        try:
            check_beam_params(params)
        except ValueError as error:
            raise InvalidRequestError(str(error)) from error
        if params.use_beam_search and params.n > min(self.config.max_num_seqs, self.config.max_beam_rows):
            raise InvalidRequestError(
                f"n: beam search of width {params.n} needs as many sequences; the engine runs {self.config.max_num_seqs} "
                f"(max_num_seqs), {self.config.max_beam_rows} of them beams (max_beam_rows)"
            )
        if params.structured_outputs is not None and self.config.max_constrained_rows == 0:
            raise InvalidRequestError("structured outputs are off on this engine (max_constrained_rows is 0)")
        if params.priority != 0 and self.config.scheduling_policy is SchedulingPolicy.FCFS:
            raise InvalidRequestError(f"priority {params.priority}: this server schedules first come, first served (scheduling_policy fcfs)")
        if not prompt_token_ids:
            raise InvalidRequestError("the prompt is empty")
        if len(prompt_token_ids) >= self.max_model_len:
            raise InvalidRequestError(
                f"the prompt has {len(prompt_token_ids)} tokens; the context holds {self.max_model_len}, "
                f"so at most {self.max_model_len - 1} prompt tokens leave room for output"
            )
        if params.allowed_token_ids is not None and any(len(sequence) > 1 for sequence in strings.bad_words):
            # The sampler would find mid-generation that no token is left, failing the whole step.
            raise InvalidRequestError("allowed_token_ids cannot be combined with bad_words of more than one token")
        vocab_size = self.model_config.vocab_size
        bad = next((t for t in prompt_token_ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(f"prompt token id {bad} is outside the vocabulary [0, {vocab_size})")
        try:
            self.runner.validate(params, strings)
        except ValueError as error:
            raise InvalidRequestError(str(error)) from error

    def _guidance(self, request: Request) -> Guidance:
        """The companion of a guided request; raises `InvalidRequestError` if it cannot run."""
        if self.config.max_num_seqs < 2 or self.max_num_batched_tokens < 2:
            raise InvalidRequestError("guidance_scale needs max_num_seqs >= 2 and max_num_batched_tokens >= 2 (two sequences per step)")
        negative_prompt = self._negative_prompt(request.strings)
        if len(negative_prompt) >= self.max_model_len:
            raise InvalidRequestError(f"the negative prompt has {len(negative_prompt)} tokens; the context holds {self.max_model_len}")
        blocks = self.scheduler.blocks
        if blocks.blocks_for(len(request.prompt_token_ids) + 1) + blocks.blocks_for(len(negative_prompt) + 1) > blocks.num_blocks:
            raise InvalidRequestError(
                f"the prompt and the negative prompt ({len(request.prompt_token_ids)} and {len(negative_prompt)} tokens) "
                f"do not fit together in the KV cache's {blocks.num_blocks} blocks of {blocks.block_size} positions"
            )
        companion = Request(f"{request.request_id}#unconditional", negative_prompt, request.params, request.output_token_ids)
        return Guidance(request.params.guidance_scale, companion)

    def _negative_prompt(self, strings: TokenizedStrings) -> list[int]:
        """The unconditional prompt's ids: ``negative_prompt``, or the bare BOS (EOS if the model has none)."""
        if strings.negative_prompt:
            return list(strings.negative_prompt)
        bos = self.tokenizer.bos_token_id
        return [bos if bos is not None else self.tokenizer.eos_token_ids[0]]

    def _num_speculative_tokens(self, params: SamplingParams) -> int:
        k = params.num_speculative_tokens
        return self.config.num_speculative_tokens if k is None else k

    def abort_requests(self, request_ids: list[str]) -> None:
        """Free the slots and blocks of these requests now; unknown or finished ids are ignored."""
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is not None:
                self.pending_outputs.append(self._finish(request, FinishReason.ABORT, None, new_token_ids=[]))
            elif request_id in self.beams.groups:
                self.pending_outputs.append(self.beams.finish(self.beams.groups[request_id], FinishReason.ABORT))

    def step(self) -> list[EngineOutput]:
        """Schedule and launch a step; return the outputs of the step whose results are in.

        Synchronous: that is this step. Asynchronous (default on CUDA): the previous one,
        collected after this one was launched, so the host's scheduling and stop checks
        overlap the device's work; a request that finished in the previous step may have
        one token computed in this step, which is discarded. While any running request
        speculates or has a grammar, steps are synchronous: drafting and the grammar's next mask
        need every sampled token on the host.
        """
        outputs, self.pending_outputs = self.pending_outputs, []
        if not (outputs or self.scheduler.running or self.scheduler.waiting or self.in_flight):
            self.constrained.wait(COMPILE_WAIT_S)
        self._schedule_compiled()
        self.beams.start_waiting()
        # Drafting, a grammar's next mask and a beam search's next round need every sampled token on the host.
        synchronous = not self.async_scheduling or any(
            r.ngram_index is not None or r.grammar is not None or self.beams.group_of(r) is not None for r in self.scheduler.running
        )
        if synchronous and self.in_flight is not None:
            outputs += self._collect(self.in_flight)
            self.in_flight = None
        self._draft()
        step = self.scheduler.schedule(self._admit)
        self._finish_too_large()
        launched = None
        if step.requests:
            prompt_rows, beam_rows = self.prompt_logprobs.plan(step), self.beams.plan_rows(step)
            launched = self.runner.launch(step, self.in_flight, self.constrained.start_masks(step), prompt_rows, beam_rows)
            for sequence, chunk in zip(step.requests, step.chunks):
                sequence.num_computed_tokens += chunk.num_tokens
            for request in step.sampled:
                _add_placeholders(request, 1)
        ready = launched
        if not synchronous:
            ready, self.in_flight = self.in_flight, launched
        if ready is not None:
            outputs += self._collect(ready)
        failed, self.pending_outputs = self.pending_outputs, []  # failed while drafting or admitted
        return outputs + failed

    def _schedule_compiled(self) -> None:
        """Queue the requests whose grammars compiled; fail those whose grammars did not."""
        ready, failed = self.constrained.compiled()
        for request in ready:
            self.scheduler.add(request)
        for request, error in failed:
            self.pending_outputs.append(self._fail(request, error))

    def _finish_too_large(self) -> None:
        """Requests that grew past what the whole block pool holds end as if at their context length."""
        for request in self.scheduler.too_large:
            group = self.beams.group_of(request)
            if group is not None:
                output = self.beams.finish(group, FinishReason.ERROR)
                output.error = RequestError("a beam grew past what the whole KV cache holds", client_fault=True)
                self.pending_outputs.append(output)
            elif not request.finished:  # finished: a beam of a search that another beam's growth ended
                self.pending_outputs.append(self._finish(request, FinishReason.LENGTH, None, new_token_ids=[]))
        self.scheduler.too_large.clear()

    def _admit(self, request: Request) -> bool:
        """Give the request (just handed its slots) its sampling row; False if that failed it."""
        try:
            self.runner.add_request(request)
        except Exception as error:
            self.pending_outputs.append(self._fail(request, error))
            return False
        return True

    def _fail(self, request: Request, error: Exception) -> EngineOutput:
        """Finish ``request`` with ``error``, unless the error belongs to no request (re-raised)."""
        if isinstance(error, ENGINE_FAULTS):
            raise error
        logger.warning("request %s failed in the engine", request.request_id, exc_info=error)
        if isinstance(error, ValueError):
            reason = RequestError(str(error), client_fault=True)
        else:
            reason = RequestError(f"the engine failed on this request ({type(error).__name__}: {error})", client_fault=False)
        output = self._finish(request, FinishReason.ERROR, None, new_token_ids=[])
        output.error = reason
        return output

    def _no_token_left(self, request: Request, new_token_ids: list[int]) -> EngineOutput:
        """Fail a request whose penalties left no logit to sample by (a 400: its own parameters)."""
        output = self._finish(request, FinishReason.ERROR, None, new_token_ids=new_token_ids)
        output.error = RequestError(NO_TOKEN_LEFT, client_fault=True)
        return output

    def _draft(self) -> None:
        """Propose drafts for speculating requests about to decode with every token on the host."""
        for request in list(self.scheduler.running):
            request.draft_token_ids = []
            index = request.ngram_index
            if index is None or request.num_placeholders or request.num_computed_tokens != request.num_tokens - 1:
                continue
            new_tokens = request.token_ids(len(index.tokens), request.num_tokens)
            max_drafts = min(self._num_speculative_tokens(request.params), request.room_to_grow(self.max_model_len) - 1)
            try:
                request.draft_token_ids = index.propose(new_tokens, max_drafts)
            except Exception as error:
                self.pending_outputs.append(self._fail(request, error))

    def _collect(self, in_flight: InFlightStep) -> list[EngineOutput]:
        outputs = []
        step = in_flight.step
        if in_flight.prompt_logprobs is not None:  # before the outputs that carry them
            self.prompt_logprobs.collect(in_flight.prompt_logprobs)
        for request, drafts, sampled in zip(step.sampled, step.draft_token_ids, self.runner.collect(in_flight)):
            _add_placeholders(request, -1)
            if request.finished:  # finished or aborted while this step ran
                continue
            if self.beams.group_of(request) is not None:
                self.beams.report(request, sampled.candidates)
                continue
            try:
                outputs.append(self._accept(request, drafts, sampled))
            except Exception as error:
                outputs.append(self._fail(request, error))
        return outputs + self.beams.advance_reported()

    def _accept(self, request: Request, drafts: list[int], sampled: SampledTokens) -> EngineOutput:
        """Take one request's results of a step: its accepted drafts and sampled tokens, up to a stop."""
        num_accepted = len(sampled.token_ids) - 1
        for sequence in request.sequences:
            sequence.num_computed_tokens -= len(drafts) - num_accepted  # the rejected drafts' cache entries are dead
            self.scheduler.blocks.trim(sequence)
        request.num_draft_tokens += len(drafts)
        request.num_accepted_tokens += num_accepted
        self.num_draft_tokens += len(drafts)
        self.num_accepted_tokens += num_accepted
        output = self._append_tokens(request, sampled)
        output.num_draft_tokens, output.num_accepted_tokens = len(drafts), num_accepted
        self.num_generated_tokens += len(output.new_token_ids)
        return output

    def _append_tokens(self, request: Request, sampled: SampledTokens) -> EngineOutput:
        """Append the step's tokens up to the first stop; the rest (and their logprobs) are dropped."""
        new_token_ids: list[int] = []
        stop: Stop | None = None
        if request.params.max_tokens == 0:  # the prompt is scored; the token sampled after it is dropped
            sampled = SampledTokens([], None)
            stop = Stop(FinishReason.LENGTH)
        for token_id in sampled.token_ids:
            if token_id < 0:  # the sampler found no token to sample
                if request.grammar is None:
                    return self._no_token_left(request, new_token_ids)
                stop = Stop(FinishReason.GRAMMAR_DEAD_END)
                break
            request.output_token_ids.append(token_id)
            new_token_ids.append(token_id)
            stop = check_stop(request, self.tokenizer.eos_token_ids, self.max_model_len)
            if stop is not None:
                break
        prompt_logprobs = self.prompt_logprobs.take(request)  # before `_finish` forgets the request's state
        if stop is None:
            if request.grammar is not None:
                advance(request.grammar, new_token_ids)
            output = EngineOutput(request.request_id, new_token_ids, len(request.prompt_token_ids))
        else:
            output = self._finish(request, stop.reason, stop.stop_token, new_token_ids=new_token_ids)
        output.prompt_logprobs = prompt_logprobs
        num_top = request.params.logprobs
        if sampled.logprobs is not None and num_top is not None:
            kept = sampled.logprobs[: len(new_token_ids)]
            output.logprobs = [e._replace(top_token_ids=e.top_token_ids[:num_top], top_logprobs=e.top_logprobs[:num_top]) for e in kept]
        return output

    def _finish(self, request: Request, reason: FinishReason, stop_reason: int | None, new_token_ids: list[int]) -> EngineOutput:
        """Free the request's slot and blocks; returns its final output.

        A launched step may still write these blocks and this sampling row; a request
        given them later only touches them in later, stream-ordered work.
        """
        request.finished = True
        if request.slot is not None:
            self.runner.remove_request(request.slot)
        if not self.constrained.discard(request):
            self.scheduler.remove(request)
        self.prompt_logprobs.discard(request)
        del self.requests[request.request_id]
        self.finished_generated_counts[request.request_id] = len(request.output_token_ids)
        if len(self.finished_generated_counts) > FINISHED_COUNTS_KEPT:
            self.finished_generated_counts.popitem(last=False)
        return EngineOutput(request.request_id, new_token_ids, len(request.prompt_token_ids), reason, stop_reason)


def _add_placeholders(request: Request, count: int) -> None:
    """Count tokens in flight for the request and its companion, which shares its outputs."""
    for sequence in request.sequences:
        sequence.num_placeholders += count
