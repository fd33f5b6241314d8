"""`EngineClient`, the ingress replica's client of the engines: a request's life in the ingress,
submitting its choices to an engine, then streaming or collecting them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from functools import partial

from ray.exceptions import RayActorError

from deployments.detok_pool import DetokClient
from deployments.engine_actor import EngineHandle, NewRequest, Refusal
from deployments.engine_channel import EngineChannel, EngineMethod
from deployments.engine_routing import EngineRouting, KeyHomes
from deployments.metrics import IngressMetrics
from deployments.openai.choices import CompletionFrames, completion_body
from deployments.openai.errors import APIError, internal_error
from deployments.openai.event_stream import EventStream, FrameSink
from deployments.openai.output_events import ChoiceDelta, StepFrames, stream_frames
from deployments.openai.protocol import StreamUsage
from deployments.openai.responses import ResponseFormat, usage
from deployments.output_router import ENGINE_CALL_TIMEOUT_S, ENGINE_FAILED, OutputRouter
from deployments.prompt_encoder import PromptEncoder
from deployments.streams import ChoiceStream, Mailbox
from deployments.tick_batcher import TickBatcher
from deployments.tracing import RequestTrace, current_trace
from detok import AnswerRules, initial_state
from engine.beam.choices import beam_choice_id
from sampling.params import SamplingParams

LEAST_LOADED = EngineRouting()
"""Where no routing is given (tests with one engine): every request to the least-loaded engine."""


class OutputTally:
    """A request's outputs counted as they are taken from its mailbox: tokens, finished choices, and
    the latency metrics and trace events they make."""

    def __init__(self, num_choices: int, arrived: float, metrics: IngressMetrics, trace: RequestTrace | None) -> None:
        self.unfinished = num_choices
        self.completion_tokens = 0
        self.arrived = arrived
        self.metrics = metrics
        self.trace = trace
        self.last = 0.0
        """`time.perf_counter` of the last deltas taken; 0 before the first."""

    def observe(self, deltas: dict[int, ChoiceDelta]) -> None:
        now = time.perf_counter()
        first, new_tokens = self.last == 0.0, 0
        for delta in deltas.values():
            new_tokens += len(delta.token_ids)
            if delta.finish_reason is not None:
                self.unfinished -= 1
                self.metrics.request_success.inc(delta.finish_reason)
        if first:
            self.metrics.ttft.observe(now - self.arrived)
        elif new_tokens:
            self.metrics.itl.observe((now - self.last) / new_tokens)
        if self.trace is not None:
            self.trace.message(new_tokens, first)
        if not self.unfinished:
            self.metrics.e2e.observe(now - self.arrived)
        self.last = now
        self.completion_tokens += new_tokens


@dataclass
class Submission:
    """One HTTP request in flight: its choices, and the prompt text to echo per choice."""

    format: ResponseFormat
    streams: list[ChoiceStream]
    mailbox: Mailbox
    num_prompt_tokens: int
    echo_texts: list[str]
    tally: OutputTally

    def usage(self, completion_tokens: int) -> dict[str, object]:
        """The OpenAI usage, with the choices' drafted and accepted tokens."""
        drafted = sum(stream.num_draft_tokens for stream in self.streams)
        accepted = sum(stream.num_accepted_tokens for stream in self.streams)
        return usage(self.num_prompt_tokens, completion_tokens, drafted, accepted)


class EngineClient:
    """Owns this ingress replica's channels to the engines (`deployments.engine_channel`), its output router and
    its batched add/abort calls."""

    def __init__(
        self,
        engines: list[EngineHandle],
        subscriber: str,
        encoder: PromptEncoder,
        detok: DetokClient,
        metrics: IngressMetrics,
        stream_interval: int = 1,
        stream_idle_timeout_s: float | None = None,
        routing: EngineRouting = LEAST_LOADED,
    ) -> None:
        self.routing = routing
        self.key_homes = KeyHomes()
        self.stream_interval = stream_interval
        self.stream_idle_timeout_s = stream_idle_timeout_s
        self.subscriber = subscriber
        self.encoder = encoder
        self.tokenizer = encoder.tokenizer
        self.metrics = metrics
        self.channels = [EngineChannel(engine, subscriber) for engine in engines]
        self.router = OutputRouter(self.channels, detok, metrics)
        self.adders = [TickBatcher(self._adder(i)) for i in range(len(engines))]
        self.aborters = [TickBatcher(self._aborter(i)) for i in range(len(engines))]

    def _adder(self, engine_index: int):
        channel = self.channels[engine_index]

        async def add(requests: list[NewRequest]) -> list[tuple[int, Refusal | None]]:
            """Per request, the engine's incarnation and why it was refused, or None."""
            reply = await asyncio.wait_for(channel.call(EngineMethod.ADD_REQUESTS, self.subscriber, requests), ENGINE_CALL_TIMEOUT_S)
            self.router.saw_incarnation(engine_index, reply.incarnation)
            return [(reply.incarnation, error) for error in reply.errors]

        return add

    def _aborter(self, engine_index: int):
        channel = self.channels[engine_index]

        async def abort(request_ids: list[str]) -> list[None]:
            incarnation = await asyncio.wait_for(channel.call(EngineMethod.ABORT_REQUESTS, request_ids), ENGINE_CALL_TIMEOUT_S)
            self.router.saw_incarnation(engine_index, incarnation)
            return [None] * len(request_ids)

        return abort

    def _abort(self, stream: ChoiceStream) -> None:
        """Abort a choice the client no longer waits for: at once in its own call, batched per tick
        (the engine learns of it a poll cycle sooner), and with the next poll (which the engine
        waits for, so it lands within the step bound of `deployments.step_credits` whatever the load)."""
        self.aborters[stream.engine_index].submit(stream.engine_request_id)
        self.router.abort(stream.engine_index, stream.engine_request_id)

    def _pick_engine(self, prompt: list[int]) -> int:
        """The engine for a request whose (first) prompt is ``prompt``, among those up, by the routing
        policy (`deployments.engine_routing`); a 503 when none is up."""
        live, down = self.router.live_per_engine, self.router.down
        up = [i for i in range(len(live)) if i not in down]
        if not up:
            raise APIError(503, ENGINE_FAILED, code="engine_failed")
        pick = self.routing.pick(prompt, live, up, self.key_homes)
        self.metrics.routing.inc(pick.placement)
        return pick.engine

    async def submit(
        self,
        format: ResponseFormat,
        prompts: list[list[int]],
        params: SamplingParams,
        echo: bool,
        client: str = "",
        client_id: str | None = None,
        answer: AnswerRules | None = None,
    ) -> Submission:
        """Add ``n`` choices per prompt to one engine (with beam search, one search of ``n`` beams per
        prompt); choice index = prompt index * n + i. ``client``: who sent it (their share of grammar compiles);
        ``client_id``: the name it gave itself, if any (its share of the queue under the priority policy);
        ``answer``: with a reasoning parser, the answer's rules the detokenizer applies (`detok.answer`)."""
        strings = await self.encoder.strings(params)  # once per HTTP request, never on the event loop or the engine thread
        engine_index = self._pick_engine(prompts[0] if prompts else [])
        mailbox = Mailbox(self.stream_interval, self.stream_idle_timeout_s)
        streams, requests, echo_texts = [], [], []
        request_of_stream: list[int] = []
        for prompt_index, prompt in enumerate(prompts):
            state = initial_state(self.tokenizer.tokenizer, prompt, params, answer)
            prompt_text = self.tokenizer.decode(prompt, skip_special_tokens=params.skip_special_tokens) if echo else ""
            search_id = f"{format.request_id}-{prompt_index}" if params.use_beam_search else None
            if search_id is not None:
                requests.append(NewRequest(search_id, prompt, params, strings, client, client_id))
            for i in range(params.n):
                index = prompt_index * params.n + i
                if search_id is None:
                    choice_params = params if params.seed is None or params.n == 1 else params.model_copy(update={"seed": params.seed + i})
                    requests.append(NewRequest(f"{format.request_id}-{index}", prompt, choice_params, strings, client, client_id))
                request_id = requests[-1].request_id if search_id is None else beam_choice_id(search_id, i)
                streams.append(ChoiceStream(request_id, index, engine_index, mailbox, state, search_id=search_id))
                request_of_stream.append(len(requests) - 1)
                echo_texts.append(prompt_text)
        for stream in streams:
            self.router.register(stream)
        try:
            replies = await asyncio.gather(*(self.adders[engine_index].submit(r) for r in requests))
        except (RayActorError, ConnectionError, TimeoutError) as error:  # the engine died, is restarting or hangs: the client may retry
            self._withdraw(streams)
            raise APIError(503, ENGINE_FAILED, code="engine_failed") from error
        except BaseException:  # the client left mid-submit: leave nothing behind
            self._withdraw(streams)
            raise
        for stream, request_index in zip(streams, request_of_stream):
            stream.incarnation = replies[request_index][0]
        if any(incarnation != self.router.incarnations[engine_index] for incarnation, _ in replies):
            self._withdraw(streams)  # the engine restarted since it took them
            raise APIError(503, ENGINE_FAILED, code="engine_failed")
        refused = [e for _, e in replies if e is not None]
        if refused:
            self._withdraw(streams)
            raise APIError(refused[0].status, refused[0].message, code=refused[0].code)
        num_prompt_tokens = sum(len(p) for p in prompts)
        self.metrics.prompt_tokens.inc(num_prompt_tokens)
        if (trace := current_trace.get()) is not None:
            trace.submitted(num_prompt_tokens, len(streams))
        tally = OutputTally(len(streams), time.perf_counter(), self.metrics, trace)
        return Submission(format, streams, mailbox, num_prompt_tokens, echo_texts, tally)

    def _withdraw(self, streams: list[ChoiceStream]) -> None:
        """Forget choices whose submission failed; abort them all, since some may have been added
        (aborting a request the engine does not hold is a no-op)."""
        for stream in streams:
            self.router.unregister(stream)
            self._abort(stream)

    def release(self, submission: Submission, cause: str) -> None:
        """Unregister the submission's choices; abort those the engine still runs."""
        submission.mailbox.close()
        for stream in submission.streams:
            self.router.unregister(stream)
            if not stream.finished:
                stream.finished = True
                self.metrics.aborts.inc(cause)
                self._abort(stream)

    def disconnect(self, submission: Submission) -> None:
        """The client left: abort the choices the engine still runs, and end the stream's wait."""
        self.release(submission, cause="client_disconnect")
        submission.mailbox.fail(APIError(499, "the client closed the request", code="client_closed_request"))

    async def deltas(self, submission: Submission) -> AsyncGenerator[dict[int, ChoiceDelta], None]:
        """The submission's deltas as its mailbox gives them (coalesced per choice), until every choice
        finished: what every API's writer renders (`deployments.openai.choices`, the Responses and
        Messages writers). Latency and output tokens are counted as they are taken (`OutputTally`), and
        the choices are released when it ends, however it ends (the writer closes it:
        `contextlib.aclosing`); the request's error raises."""
        tally = submission.tally
        try:
            while tally.unfinished:
                deltas = await submission.mailbox.take()
                tally.observe(deltas)
                yield deltas
        finally:
            self.metrics.generation_tokens.inc(tally.completion_tokens)
            self.release(submission, cause="client_disconnect")
            if tally.trace is not None:
                tally.trace.outputs_ended(tally.completion_tokens)

    def stream(self, submission: Submission, usage: StreamUsage) -> EventStream:
        """A completion's or chat's SSE response (`deployments.openai.choices.CompletionFrames`)."""
        return self.event_stream(submission, CompletionFrames(submission.format, submission.echo_texts, submission.usage, usage))

    def event_stream(self, submission: Submission, frames: StepFrames) -> EventStream:
        """The SSE response of any API's ``frames`` (`deployments.openai.output_events.stream_frames`). Where
        the server lets frames be written directly, a one-choice request's steps are made and written from
        the router's loop as they are delivered (`_write_directly`)."""
        write_directly = partial(self._write_directly, submission, frames) if len(submission.streams) == 1 else None
        return EventStream(stream_frames(frames, self.deltas(submission)), lambda: self.disconnect(submission), write_directly=write_directly)

    @staticmethod
    def _write_directly(submission: Submission, frames: StepFrames, sink: FrameSink) -> None:
        """From now on the mailbox's deltas that finish nothing are made into a frame and written in the
        router's call, while ``sink`` takes writes at once; the rest wakes the request's task as before
        (`Mailbox.reader`), which then writes the end of the stream."""

        def read(mailbox: Mailbox) -> bool:
            if not sink.ready():
                return False
            deltas = mailbox.take_now()
            submission.tally.observe(deltas)
            try:
                frame = frames.step(deltas)
            except Exception as error:  # this request's fault alone: its task ends the stream with the error
                mailbox.fail(error if isinstance(error, APIError) else internal_error(error, "a response stream"))
                return True
            sink.write(frame)
            return True

        submission.mailbox.reader = read

    async def collect(self, submission: Submission) -> dict[str, object]:
        """A completion's or chat's whole body (`deployments.openai.choices.completion_body`)."""
        return await completion_body(submission.format, submission.echo_texts, self.deltas(submission), submission.usage)
