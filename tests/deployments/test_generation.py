"""`Generation.submit` in-process, against a fake engine handle: a client that leaves while its
request is being added leaves nothing behind in the ingress or the engine."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

from ray.exceptions import ActorDiedError

from deployments.detok_pool import DetokClient
from deployments.errors import APIError
from deployments.generation import Generation
from deployments.metrics import IngressMetrics
from deployments.responses import ResponseFormat
from engine.loader.checkpoint import DEFAULT_MODEL, load_tokenizer
from sampling.params import SamplingParams
from sampling.tokenized import tokenize_strings

TOKENIZER = load_tokenizer(DEFAULT_MODEL)


class _Remote:
    """Stands for a Ray actor method: ``.remote(...)`` returns an awaitable."""

    def __init__(self, method) -> None:
        self.method = method

    def remote(self, *args):
        return self.method(*args)


class SlowEngine:
    """Adds after a delay (the caller may be gone by then) and records every call; ``dead``: the actor is restarting."""

    def __init__(self, dead: bool = False) -> None:
        self.dead = dead
        self.added: list[str] = []
        self.received: list = []
        self.aborted: list[str] = []
        self.add_requests = _Remote(self._add)
        self.abort_requests = _Remote(self._abort)
        self.get_outputs = _Remote(self._outputs)

    async def _add(self, subscriber: str, requests: list) -> list[None]:
        await asyncio.sleep(0.05)
        if self.dead:
            raise ActorDiedError()
        self.added += [r.request_id for r in requests]
        self.received += requests
        return [None] * len(requests)

    async def _abort(self, request_ids: list[str]) -> None:
        self.aborted += request_ids

    async def _outputs(self, subscriber: str, timeout_s: float) -> list:
        await asyncio.sleep(timeout_s)
        return []


def new_generation(engine: SlowEngine) -> Generation:
    detok = DetokClient(TOKENIZER.tokenizer, None, inline_threshold=0, tokens_per_call=1)
    return Generation([engine], "sub", TOKENIZER, detok, IngressMetrics())


def submit(generation: Generation):
    fmt = ResponseFormat.new("cmpl-x", "m", chat=False)
    return generation.submit(fmt, [TOKENIZER.encode("Hello")], SamplingParams(n=2), echo=False)


def test_a_submit_cancelled_mid_add_unregisters_and_aborts_its_choices():
    async def run() -> tuple[SlowEngine, int]:
        engine = SlowEngine()
        generation = new_generation(engine)
        task = asyncio.create_task(submit(generation))
        await asyncio.sleep(0.01)  # the add is in flight
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0.1)  # the add lands, then the aborts go out
        return engine, len(generation.router.streams)

    engine, live = asyncio.run(run())
    assert live == 0
    assert engine.added == ["cmpl-x-0", "cmpl-x-1"]
    assert sorted(engine.aborted) == engine.added


def test_a_submit_to_a_restarting_engine_is_a_503():
    async def run() -> tuple[BaseException | None, int]:
        generation = new_generation(SlowEngine(dead=True))
        try:
            await submit(generation)
        except APIError as error:
            return error, len(generation.router.streams)
        return None, len(generation.router.streams)

    error, live = asyncio.run(run())
    assert isinstance(error, APIError) and (error.status, error.code) == (503, "engine_failed")
    assert live == 0


def test_requests_go_to_the_engine_with_the_fewest_live_choices():
    async def run() -> None:
        engines = [SlowEngine(), SlowEngine()]
        detok = DetokClient(TOKENIZER.tokenizer, None, inline_threshold=0, tokens_per_call=1)
        generation = Generation(engines, "sub", TOKENIZER, detok, IngressMetrics())
        first = await submit(generation)  # n=2 on engine 0
        assert [s.engine_index for s in first.streams] == [0, 0]
        second = await submit(generation)
        assert [s.engine_index for s in second.streams] == [1, 1]
        generation.release(first, cause="client_disconnect")
        generation.release(first, cause="client_disconnect")  # twice: counted once
        assert generation.router.live_per_engine == [0, 2]
        third = await submit(generation)
        assert [s.engine_index for s in third.streams] == [0, 0]
        assert engines[0].added == [s.request_id for s in first.streams + third.streams]

    asyncio.run(asyncio.wait_for(run(), 30))


def test_request_strings_are_tokenized_once_per_request_on_a_worker_thread():
    tokenizer = dataclasses.replace(TOKENIZER)
    threads: list[threading.Thread] = []

    def encode(text: str, add_special_tokens: bool = True) -> list[int]:
        threads.append(threading.current_thread())
        return TOKENIZER.encode(text, add_special_tokens)

    tokenizer.encode = encode  # type: ignore[method-assign]
    params = SamplingParams(n=3, seed=5, bad_words=["foo"], dry_multiplier=0.5, guidance_scale=2.0, negative_prompt="no")

    async def run() -> tuple[SlowEngine, threading.Thread]:
        engine = SlowEngine()
        detok = DetokClient(TOKENIZER.tokenizer, None, inline_threshold=0, tokens_per_call=1)
        generation = Generation([engine], "sub", tokenizer, detok, IngressMetrics())
        fmt = ResponseFormat.new("cmpl-x", "m", chat=False)
        await generation.submit(fmt, [TOKENIZER.encode("Hello"), TOKENIZER.encode("Bye")], params, echo=False)
        return engine, threading.current_thread()

    engine, loop_thread = asyncio.run(asyncio.wait_for(run(), 30))
    expected = tokenize_strings(params, TOKENIZER.encode)
    assert len(threads) == 2 + len(params.dry_sequence_breakers) + 1  # per request: bad word twice, breakers, negative prompt
    assert loop_thread not in threads
    assert len(engine.received) == 6 and all(r.strings == expected for r in engine.received)
    assert len({id(r.strings) for r in engine.received}) == 1
