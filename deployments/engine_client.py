"""`EngineClient`, the ingress replica's client of the engines: a request's life in the ingress,
submitting its choices to an engine, then streaming or collecting them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from ray.exceptions import RayActorError

from deployments.detok_pool import DetokClient
from deployments.engine_actor import EngineHandle, NewRequest, Refusal
from deployments.metrics import IngressMetrics
from deployments.openai.errors import APIError, internal_error
from deployments.openai.logprobs import LogprobEntry, PromptLogprobEntries
from deployments.openai.protocol import StreamUsage
from deployments.openai.responses import DONE_FRAME, ResponseFormat, sse, usage
from deployments.openai.tool_calls import ChoiceToolCalls
from deployments.output_router import ENGINE_CALL_TIMEOUT_S, ENGINE_FAILED, OutputRouter
from deployments.prompt_encoder import PromptEncoder
from deployments.streams import ChoiceDelta, ChoiceStream, Mailbox
from deployments.tick_batcher import TickBatcher
from detok import initial_state
from engine.beam.choices import beam_choice_id
from sampling.params import SamplingParams


@dataclass
class Submission:
    """One HTTP request in flight: its choices, and the prompt text to echo per choice."""

    format: ResponseFormat
    streams: list[ChoiceStream]
    mailbox: Mailbox
    num_prompt_tokens: int
    echo_texts: list[str]
    arrived: float

    def usage(self, completion_tokens: int) -> dict[str, object]:
        """The OpenAI usage, with the choices' drafted and accepted tokens."""
        drafted = sum(stream.num_draft_tokens for stream in self.streams)
        accepted = sum(stream.num_accepted_tokens for stream in self.streams)
        return usage(self.num_prompt_tokens, completion_tokens, drafted, accepted)


class EngineClient:
    """Owns this ingress replica's engine handles, output router and batched add/abort calls."""

    def __init__(
        self,
        engines: list[EngineHandle],
        subscriber: str,
        encoder: PromptEncoder,
        detok: DetokClient,
        metrics: IngressMetrics,
        stream_interval: int = 1,
        stream_idle_timeout_s: float | None = None,
    ) -> None:
        self.engines = engines
        self.stream_interval = stream_interval
        self.stream_idle_timeout_s = stream_idle_timeout_s
        self.subscriber = subscriber
        self.encoder = encoder
        self.tokenizer = encoder.tokenizer
        self.metrics = metrics
        self.router = OutputRouter(engines, subscriber, detok, metrics)
        self.adders = [TickBatcher(self._adder(i)) for i in range(len(engines))]
        self.aborters = [TickBatcher(self._aborter(i)) for i in range(len(engines))]

    def _adder(self, engine_index: int):
        engine = self.engines[engine_index]

        async def add(requests: list[NewRequest]) -> list[tuple[int, Refusal | None]]:
            """Per request, the engine's incarnation and why it was refused, or None."""
            reply = await asyncio.wait_for(engine.add_requests.remote(self.subscriber, requests), ENGINE_CALL_TIMEOUT_S)
            self.router.saw_incarnation(engine_index, reply.incarnation)
            return [(reply.incarnation, error) for error in reply.errors]

        return add

    def _aborter(self, engine_index: int):
        engine = self.engines[engine_index]

        async def abort(request_ids: list[str]) -> list[None]:
            incarnation = await asyncio.wait_for(engine.abort_requests.remote(request_ids), ENGINE_CALL_TIMEOUT_S)
            self.router.saw_incarnation(engine_index, incarnation)
            return [None] * len(request_ids)

        return abort

    def _abort(self, stream: ChoiceStream) -> None:
        """Abort a choice the client no longer waits for: at once in its own call, batched per tick
        (the engine learns of it a poll cycle sooner), and with the next poll (which the engine
        waits for, so it lands within the step bound of `deployments.step_credits` whatever the load)."""
        self.aborters[stream.engine_index].submit(stream.engine_request_id)
        self.router.abort(stream.engine_index, stream.engine_request_id)

    def _pick_engine(self) -> int:
        """The engine with the fewest live choices among those up (a 503 when none is)."""
        live, down = self.router.live_per_engine, self.router.down
        up = [i for i in range(len(live)) if i not in down]
        if not up:
            raise APIError(503, ENGINE_FAILED, code="engine_failed")
        return min(up, key=live.__getitem__)

    async def submit(
        self, format: ResponseFormat, prompts: list[list[int]], params: SamplingParams, echo: bool, client: str = "", client_id: str | None = None
    ) -> Submission:
        """Add ``n`` choices per prompt to one engine (with beam search, one search of ``n`` beams per
        prompt); choice index = prompt index * n + i. ``client``: who sent it (their share of grammar compiles);
        ``client_id``: the name it gave itself, if any (its share of the queue under the priority policy)."""
        strings = await self.encoder.strings(params)  # once per HTTP request, never on the event loop or the engine thread
        engine_index = self._pick_engine()
        mailbox = Mailbox(self.stream_interval, self.stream_idle_timeout_s)
        streams, requests, echo_texts = [], [], []
        request_of_stream: list[int] = []
        for prompt_index, prompt in enumerate(prompts):
            state = initial_state(self.tokenizer.tokenizer, prompt, params)
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
        except (RayActorError, TimeoutError) as error:  # the engine died, is restarting or hangs: the client may retry
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
        self.metrics.tokens.inc("prompt", sum(len(p) for p in prompts))
        return Submission(format, streams, mailbox, sum(len(p) for p in prompts), echo_texts, time.perf_counter())

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

    async def stream(self, submission: Submission, usage: StreamUsage) -> AsyncGenerator[str, None]:
        """SSE frames until every choice finished, then ``[DONE]``; an error frame if the request fails midway."""
        fmt = submission.format
        completion_tokens, unfinished = 0, len(submission.streams)
        first, last = True, 0.0
        tail = ""  # the last chunk, usage and [DONE] go out in one write

        def usage_so_far() -> dict[str, object] | None:
            return submission.usage(completion_tokens) if usage.continuous else None

        try:
            offsets = [len(text) for text in submission.echo_texts]
            calls = [ChoiceToolCalls(fmt.tool_calls) for _ in submission.streams] if fmt.tool_calls else None
            # An echo with logprobs goes out with its logprobs, which come with the choice's first delta.
            opening = [""] * len(offsets) if fmt.echo_logprobs is not None else submission.echo_texts
            if fmt.chat or any(opening):
                roles = [fmt.chunk_choice(s.index, opening[i], None, None, role=True) for i, s in enumerate(submission.streams)]
                yield fmt.chunk_frame(roles, usage_so_far())
            while unfinished:
                deltas = await submission.mailbox.take()
                now = time.perf_counter()
                new_tokens, choices = 0, []
                for i, d in sorted(deltas.items()):
                    new_tokens += len(d.token_ids)
                    unfinished -= d.finish_reason is not None
                    choices.append(choice_json(fmt, i, d, offsets[i], calls[i] if calls else None, submission.echo_texts[i]))
                    offsets[i] += len(d.text)
                self._observe_latency(submission, first, last, now, new_tokens)
                first, last = False, now
                completion_tokens += new_tokens
                if unfinished:
                    yield fmt.encoded_chunk_frame(choices, usage_so_far())
                else:
                    tail = fmt.encoded_chunk_frame(choices, usage_so_far())
            if usage.final:
                tail += sse(fmt.usage_chunk(submission.usage(completion_tokens)))
        except APIError as error:
            tail = error.sse_frame()
        except Exception as error:  # a fault of this request alone: its stream ends with an error frame, not cut
            tail = internal_error(error, "a response stream").sse_frame()
        finally:
            self.metrics.tokens.inc("output", completion_tokens)
            self.release(submission, cause="client_disconnect")
        yield tail + DONE_FRAME

    async def collect(self, submission: Submission) -> dict[str, object]:
        """The whole response body once every choice finished."""
        fmt = submission.format
        texts = list(submission.echo_texts)
        logprobs: list[list[LogprobEntry] | None] = [None] * len(texts)
        prompts: list[PromptLogprobEntries | None] = [None] * len(texts)
        finish: dict[int, tuple[str | None, int | str | None]] = {}
        completion_tokens = 0
        try:
            while len(finish) < len(submission.streams):
                for index, delta in (await submission.mailbox.take()).items():
                    if completion_tokens == 0:
                        self.metrics.ttft.observe(time.perf_counter() - submission.arrived)
                    texts[index] += delta.text
                    if delta.logprobs is not None:
                        logprobs[index] = (logprobs[index] or []) + delta.logprobs
                    if delta.prompt_logprobs is not None:
                        prompts[index] = delta.prompt_logprobs
                    completion_tokens += len(delta.token_ids)
                    if delta.finish_reason is not None:
                        finish[index] = (delta.finish_reason, delta.stop_reason)
        finally:
            self.metrics.tokens.inc("output", completion_tokens)
            self.release(submission, cause="client_disconnect")
        choices = [
            full_choice(fmt, i, texts[i], *finish[i], choice_logprobs(fmt, logprobs[i], prompts[i], len(submission.echo_texts[i])))
            for i in range(len(submission.streams))
        ]
        return fmt.add_prompt_logprobs(fmt.full(choices, submission.usage(completion_tokens)), prompts)

    def _observe_latency(self, submission: Submission, first: bool, last: float, now: float, new_tokens: int) -> None:
        if first:
            self.metrics.ttft.observe(now - submission.arrived)
        elif new_tokens:
            self.metrics.itl.observe((now - last) / new_tokens)


def choice_json(fmt: ResponseFormat, index: int, delta: ChoiceDelta, offset: int, calls: ChoiceToolCalls | None, echo_text: str) -> str:
    """A stream chunk's choice for ``delta``, encoded; with ``calls``, its text read for tool calls. A
    first delta with the prompt's logprobs of an echo starts with ``echo_text``."""
    logprobs = choice_logprobs(fmt, delta.logprobs, delta.prompt_logprobs, offset)
    if calls is None:
        echoed = echo_text if fmt.echo_logprobs is not None and delta.prompt_logprobs is not None else ""
        return fmt.choice_json(index, echoed + delta.text, delta.finish_reason, delta.stop_reason, logprobs=logprobs)
    text, new_calls = calls.feed(delta.text, finished=delta.finish_reason is not None)
    return fmt.choice_json(index, text, calls.finish_reason(delta.finish_reason), delta.stop_reason, logprobs=logprobs, tool_calls=new_calls)


def choice_logprobs(fmt: ResponseFormat, generated: list[LogprobEntry] | None, prompt: PromptLogprobEntries | None, offset: int) -> dict[str, object] | None:
    """A choice's ``logprobs``: an echo's prompt tokens first (when these are the ones that came with
    them), then the generated tokens, which start at ``offset`` in the choice's text."""
    if fmt.echo_logprobs is not None and prompt is not None:
        return fmt.echo_logprobs_field(generated, prompt)
    return fmt.logprobs(generated, offset)


def full_choice(
    fmt: ResponseFormat, index: int, text: str, finish_reason: str | None, stop_reason: int | str | None, logprobs: dict[str, object] | None
) -> dict[str, object]:
    """A whole response's choice; with the format's tool calls, its text read for them."""
    if fmt.tool_calls is None:
        return fmt.full_choice(index, text, finish_reason, stop_reason, logprobs)
    calls = ChoiceToolCalls(fmt.tool_calls)
    content, _ = calls.feed(text, finished=True)
    return fmt.full_choice(index, content, calls.finish_reason(finish_reason), stop_reason, logprobs, calls.calls)
