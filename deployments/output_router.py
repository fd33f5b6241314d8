"""The ingress's output loop: one per engine, from engine messages (polled over `deployments.engine_channel`)
to request mailboxes.

It also watches each engine's incarnation (in every reply): a changed one means the actor
was restarted and lost its requests, so the streams added to the old incarnation end at
once with an ``engine_failed`` error frame. An engine whose poll fails is marked down
(`EngineClient` sends it no new requests) until it answers again.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from deployments.detok_pool import DetokClient
from deployments.metrics import IngressMetrics
from deployments.openai.errors import APIError
from deployments.openai.logprobs import logprob_entries, logprob_token_ids, prompt_logprob_entries, prompt_logprob_token_ids
from deployments.streams import ChoiceStream
from detok import DetokItem, DetokResult
from engine.beam.choices import beam_choice_outputs
from engine.outputs import EngineOutput

if TYPE_CHECKING:
    from deployments.engine_actor import Polled

logger = logging.getLogger(__name__)

ENGINE_POLL_TIMEOUT_S = 1.0
ENGINE_CALL_TIMEOUT_S = 30.0  # an engine that answers no call in this long is taken for dead
ENGINE_FAILED = "the engine serving this request failed; it is being restarted"


class OutputPoll(Protocol):
    """One engine's long poll for this replica (`deployments.engine_channel.EngineChannel`)."""

    async def poll(self, timeout_s: float, aborts: list[str]) -> Polled: ...


class OutputRouter:
    """Long-polls each engine for this replica's outputs (one message per step, coalesced
    when the ingress is slower), detokenizes them in one batch, and fills mailboxes.

    A stop string found by the detokenizer finishes the choice here; its abort goes to the
    engine with the next poll (which the engine waits for: see `deployments.step_credits`),
    as every abort does. Outputs for finished choices are dropped.
    """

    def __init__(self, channels: list[OutputPoll], detok: DetokClient, metrics: IngressMetrics) -> None:
        self.channels = channels
        self.detok = detok
        self.metrics = metrics
        self.pending_aborts: list[list[str]] = [[] for _ in channels]
        self.streams: dict[str, ChoiceStream] = {}
        self.live_per_engine = [0] * len(channels)
        """Registered streams per engine: the load `EngineClient` balances, kept as they come and go."""
        self.incarnations: list[int | None] = [None] * len(channels)
        self.down: set[int] = set()
        """Engines whose last poll failed: restarting, or gone."""
        # Empty contexts, so that Ray does not cancel the engine polls with the request that
        # happened to start this router (see `TickBatcher`).
        loop = asyncio.get_running_loop()
        self.tasks = [loop.create_task(self._loop(i), context=contextvars.Context()) for i in range(len(channels))]

    def register(self, stream: ChoiceStream) -> None:
        self.streams[stream.request_id] = stream
        self.live_per_engine[stream.engine_index] += 1

    def unregister(self, stream: ChoiceStream) -> None:
        if self.streams.pop(stream.request_id, None) is not None:
            self.live_per_engine[stream.engine_index] -= 1

    def abort(self, engine_index: int, request_id: str) -> None:
        """Abort a request with the next poll of its engine."""
        self.pending_aborts[engine_index].append(request_id)

    def saw_incarnation(self, engine_index: int, incarnation: int) -> None:
        """An engine answered: it is up; if it restarted, fail the streams its last life held."""
        self.down.discard(engine_index)
        known, self.incarnations[engine_index] = self.incarnations[engine_index], incarnation
        if known is not None and known != incarnation:
            logger.error("engine %d restarted", engine_index)
            self._fail_streams(engine_index, known)

    def _engine_down(self, engine_index: int) -> None:
        self.down.add(engine_index)
        known = self.incarnations[engine_index]
        if known is not None:
            self._fail_streams(engine_index, known)

    def _fail_streams(self, engine_index: int, incarnation: int) -> None:
        """End the streams added to ``incarnation`` of an engine, which is gone."""
        error = APIError(503, ENGINE_FAILED, code="engine_failed")
        for stream in list(self.streams.values()):
            if stream.engine_index == engine_index and stream.incarnation == incarnation and not stream.finished:
                stream.finished = True
                self.metrics.aborts.inc("engine_failure")
                stream.mailbox.fail(error)

    async def _loop(self, engine_index: int) -> None:
        channel = self.channels[engine_index]
        task = asyncio.current_task()
        while True:
            if task is not None and task.cancelling():
                # Cancelled while a poll's answer landed: Python 3.11's wait_for returned the answer
                # and dropped the cancel, which must still end the loop (a replica's shutdown waits for it).
                raise asyncio.CancelledError
            aborts, self.pending_aborts[engine_index] = self.pending_aborts[engine_index], []
            try:
                polled = await asyncio.wait_for(channel.poll(ENGINE_POLL_TIMEOUT_S, aborts), ENGINE_CALL_TIMEOUT_S)
            except Exception as error:  # the actor died (Ray restarts it) or hangs
                logger.error("engine %d failed: %r", engine_index, error)
                self._engine_down(engine_index)
                await asyncio.sleep(0.5)
                continue
            self.saw_incarnation(engine_index, polled.incarnation)
            if polled.subscriber_lost:  # this replica was silent so long that the engine aborted its requests
                logger.error("engine %d took this replica for dead and aborted its requests", engine_index)
                self._fail_streams(engine_index, polled.incarnation)
            if polled.outputs:
                try:
                    await self._route(polled.outputs)
                except Exception:
                    logger.exception("routing engine outputs failed")

    async def _route(self, outputs: list[EngineOutput]) -> None:
        live: list[tuple[ChoiceStream, EngineOutput, int]] = []
        items: list[DetokItem] = []
        streams = self.streams
        for output in merge_outputs(expand_beams(outputs)):
            stream = streams.get(output.request_id)
            if stream is None or stream.finished:
                continue
            if output.prompt_logprobs is None and output.logprobs is None:  # the common case: no strings to render
                live.append((stream, output, 0))
                items.append(DetokItem(stream.detok_state, output.new_token_ids, output.finish_reason is not None))
                continue
            prompt_ids = [] if output.prompt_logprobs is None else prompt_logprob_token_ids(output.prompt_logprobs)
            logprob_ids = [] if output.logprobs is None else logprob_token_ids(output.new_token_ids, output.logprobs)
            live.append((stream, output, len(prompt_ids)))
            items.append(DetokItem(stream.detok_state, output.new_token_ids, output.finish_reason is not None, prompt_ids + logprob_ids))
        if not live:
            return
        self.metrics.detok_batch.observe(len(items))
        results = await self.detok.detokenize(items)
        for (stream, output, num_prompt_strings), result in zip(live, results):
            self._deliver(stream, output, result, num_prompt_strings)

    def _deliver(self, stream: ChoiceStream, output: EngineOutput, result: DetokResult, num_prompt_strings: int) -> None:
        """``result.token_strings``: the prompt logprobs' first ``num_prompt_strings``, then the new tokens'."""
        if stream.finished:  # e.g. the client left while the batch was being detokenized
            return
        stream.detok_state = result.state
        if output.error is not None:  # the engine failed this request alone; it is finished there
            stream.finished = True
            status, code = (400, "invalid_request") if output.error.client_fault else (500, "engine_request_failed")
            stream.mailbox.fail(APIError(status, output.error.message, code=code))
            return
        if result.error is not None:
            stream.finished = True
            stream.mailbox.fail(APIError(500, f"detokenization failed: {result.error}", code="detokenization_error"))
            if output.finish_reason is None:
                self.abort(stream.engine_index, stream.engine_request_id)
            return
        strings = result.token_strings
        logprobs = logprob_entries(output.logprobs, strings[num_prompt_strings:]) if output.logprobs is not None else None
        prompt = None if output.prompt_logprobs is None else prompt_logprob_entries(output.prompt_logprobs, strings[:num_prompt_strings])
        if output.num_draft_tokens:
            stream.num_draft_tokens += output.num_draft_tokens
            stream.num_accepted_tokens += output.num_accepted_tokens
        if result.stop is not None:
            stream.finished = True
            keep = result.stop.keep_tokens
            token_ids = output.new_token_ids[:keep]
            reason = "stop" if result.stop.stop is not None else "length"  # None: the answer's max_tokens (`detok.answer`)
            stream.mailbox.push(stream.index, result.text, token_ids, reason, result.stop.stop, None if logprobs is None else logprobs[:keep], prompt)
            if output.finish_reason is None:
                self.metrics.aborts.inc("stop_string" if result.stop.stop is not None else "answer_length")
                self.abort(stream.engine_index, stream.engine_request_id)
            return
        finish_reason = output.finish_reason.value if output.finish_reason is not None else None
        stream.finished = finish_reason is not None
        stream.mailbox.push(stream.index, result.text, output.new_token_ids, finish_reason, output.stop_reason, logprobs, prompt)


def expand_beams(outputs: list[EngineOutput]) -> list[EngineOutput]:
    """A beam search's final output as one output per beam (its choices' streams are registered under those ids)."""
    if all(output.beams is None for output in outputs):
        return outputs
    return [choice for output in outputs for choice in (beam_choice_outputs(output) if output.beams is not None else [output])]


def merge_outputs(outputs: list[EngineOutput]) -> list[EngineOutput]:
    """One output per request: a message that coalesced several steps may hold several
    for one request, and each detok call must start from the state the previous one left."""
    if len({output.request_id for output in outputs}) == len(outputs):
        return outputs  # the common case, one step's worth: nothing to merge or copy
    merged: dict[str, EngineOutput] = {}
    for output in outputs:
        first = merged.get(output.request_id)
        if first is None:
            merged[output.request_id] = replace(output, new_token_ids=list(output.new_token_ids))
            continue
        first.new_token_ids.extend(output.new_token_ids)
        if output.logprobs is not None:
            first.logprobs = (first.logprobs or []) + output.logprobs
        first.finish_reason, first.stop_reason, first.error = output.finish_reason, output.stop_reason, output.error
        first.num_draft_tokens += output.num_draft_tokens
        first.num_accepted_tokens += output.num_accepted_tokens
    return list(merged.values())
