"""`EngineClient.submit` in-process, against a fake engine handle: a client that leaves while its
request is being added leaves nothing behind in the ingress or the engine."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

from ray.exceptions import ActorDiedError

from deployments.detok_pool import DetokClient
from deployments.engine_actor import Added, Polled
from deployments.engine_channel import ChannelAddress, ChannelServer, EngineMethod, Method
from deployments.engine_client import EngineClient
from deployments.engine_routing import EngineRouting, Placement, RoutingPolicy
from deployments.metrics import IngressMetrics
from deployments.openai.errors import APIError
from deployments.openai.responses import ResponseFormat
from deployments.prompt_encoder import PromptEncoder
from engine.config import DEFAULT_MODEL
from engine.loader.model_files import load_tokenizer
from sampling.params import SamplingParams
from sampling.tokenized import tokenize_strings

TOKENIZER = load_tokenizer(DEFAULT_MODEL)


class Remote:
    """Stands for a Ray actor method: ``.remote(...)`` returns an awaitable."""

    def __init__(self, method) -> None:
        self.method = method

    def remote(self, *args):
        return self.method(*args)


def loopback_channel(get_outputs: Method, add_requests: Method, abort_requests: Method) -> ChannelServer:
    """A fake engine's channel: the real server on loopback, serving the fake's methods."""
    methods = {EngineMethod.GET_OUTPUTS: get_outputs, EngineMethod.ADD_REQUESTS: add_requests, EngineMethod.ABORT_REQUESTS: abort_requests}
    return ChannelServer(methods, "127.0.0.1")


class SlowEngine:
    """Adds after a delay (the caller may be gone by then) and records every call; ``dead``: the actor is restarting."""

    def __init__(self, dead: bool = False, incarnation: int = 1) -> None:
        self.dead = dead
        self.incarnation = incarnation
        self.added: list[str] = []
        self.received: list = []
        self.aborted: list[str] = []
        self.channel = loopback_channel(self._outputs, self._add, self._abort)
        self.channel_address = Remote(self._channel)

    async def _channel(self) -> ChannelAddress:
        if self.dead:
            raise ActorDiedError()
        return await self.channel.address()

    async def _add(self, subscriber: str, requests: list) -> Added:
        await asyncio.sleep(0.05)
        if self.dead:
            raise ActorDiedError()
        self.added += [r.request_id for r in requests]
        self.received += requests
        return Added(self.incarnation, [None] * len(requests))

    async def _abort(self, request_ids: list[str]) -> int:
        self.aborted += request_ids
        return self.incarnation

    async def _outputs(self, subscriber: str, timeout_s: float, aborts: list[str]) -> Polled:
        self.aborted += aborts
        await asyncio.sleep(timeout_s)
        if self.dead:
            raise ActorDiedError()
        return Polled(self.incarnation, [])


def new_client(engine: SlowEngine) -> EngineClient:
    detok = DetokClient(TOKENIZER.tokenizer, None, inline_threshold=0, tokens_per_call=1)
    return EngineClient([engine], "sub", PromptEncoder(TOKENIZER), detok, IngressMetrics("tiny-random", "test-replica"))


def submit(client: EngineClient):
    fmt = ResponseFormat.new("cmpl-x", "m", chat=False)
    return client.submit(fmt, [TOKENIZER.encode("Hello")], SamplingParams(n=2), echo=False)


def test_a_submit_cancelled_mid_add_unregisters_and_aborts_its_choices():
    async def run() -> tuple[SlowEngine, int]:
        engine = SlowEngine()
        client = new_client(engine)
        task = asyncio.create_task(submit(client))
        await asyncio.sleep(0.01)  # the add is in flight
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        while len(engine.aborted) < 4:  # the aborts go out at once, and again with the next poll
            await asyncio.sleep(0.05)
        return engine, len(client.router.streams)

    engine, live = asyncio.run(asyncio.wait_for(run(), 30))
    assert live == 0
    assert engine.added == ["cmpl-x-0", "cmpl-x-1"]
    assert sorted(engine.aborted) == sorted(engine.added * 2)


def test_a_submit_to_a_restarting_engine_is_a_503():
    async def run() -> tuple[BaseException | None, int]:
        client = new_client(SlowEngine(dead=True))
        try:
            await submit(client)
        except APIError as error:
            return error, len(client.router.streams)
        return None, len(client.router.streams)

    error, live = asyncio.run(run())
    assert isinstance(error, APIError) and (error.status, error.code) == (503, "engine_failed")
    assert live == 0


def test_requests_go_to_the_engine_with_the_fewest_live_choices():
    async def run() -> None:
        engines = [SlowEngine(), SlowEngine()]
        detok = DetokClient(TOKENIZER.tokenizer, None, inline_threshold=0, tokens_per_call=1)
        client = EngineClient(engines, "sub", PromptEncoder(TOKENIZER), detok, IngressMetrics("tiny-random", "test-replica"))
        first = await submit(client)  # n=2 on engine 0
        assert [s.engine_index for s in first.streams] == [0, 0]
        second = await submit(client)
        assert [s.engine_index for s in second.streams] == [1, 1]
        client.release(first, cause="client_disconnect")
        client.release(first, cause="client_disconnect")  # twice: counted once
        assert client.router.live_per_engine == [0, 2]
        third = await submit(client)
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
        client = EngineClient([engine], "sub", PromptEncoder(tokenizer, inline_max_bytes=0), detok, IngressMetrics("tiny-random", "test-replica"))
        fmt = ResponseFormat.new("cmpl-x", "m", chat=False)
        await client.submit(fmt, [TOKENIZER.encode("Hello"), TOKENIZER.encode("Bye")], params, echo=False)
        return engine, threading.current_thread()

    engine, loop_thread = asyncio.run(asyncio.wait_for(run(), 30))
    expected = tokenize_strings(params, TOKENIZER.encode)
    assert len(threads) == 3 + len(params.dry_sequence_breakers) + 1  # per request: anchor and bad word twice, breakers, negative prompt
    assert loop_thread not in threads
    assert len(engine.received) == 6 and all(r.strings == expected for r in engine.received)
    assert len({id(r.strings) for r in engine.received}) == 1


def test_a_restarted_engine_ends_the_streams_of_its_old_life_and_keeps_the_new_ones():
    """The restart is seen in a reply's incarnation (no call failed): the choices added before it
    fail with engine_failed at once; choices added after it stream on."""

    async def run() -> None:
        engine = SlowEngine(incarnation=1)
        client = new_client(engine)
        old = await submit(client)
        engine.incarnation = 2  # Ray restarted the actor; the next poll says so
        try:
            await asyncio.wait_for(old.mailbox.take(), 30)
        except APIError as error:
            assert (error.status, error.code) == (503, "engine_failed")
        else:
            raise AssertionError("the old stream did not fail")
        new = await submit(client)
        assert [s.incarnation for s in new.streams] == [2, 2]
        assert not any(s.finished for s in new.streams)
        assert client.router.incarnations == [2]

    asyncio.run(run())


def test_new_requests_skip_an_engine_whose_poll_fails_until_it_answers_again():
    async def run() -> None:
        engines = [SlowEngine(dead=True), SlowEngine()]
        detok = DetokClient(TOKENIZER.tokenizer, None, inline_threshold=0, tokens_per_call=1)
        client = EngineClient(engines, "sub", PromptEncoder(TOKENIZER), detok, IngressMetrics("tiny-random", "test-replica"))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while 0 not in client.router.down:
            assert loop.time() < deadline
            await asyncio.sleep(0.05)
        for _ in range(3):  # engine 0 has fewer live choices, but it is down
            assert [s.engine_index for s in (await submit(client)).streams] == [1, 1]
        engines[0].dead = False
        while 0 in client.router.down:
            assert loop.time() < deadline
            await asyncio.sleep(0.05)
        assert [s.engine_index for s in (await submit(client)).streams] == [0, 0]

    asyncio.run(asyncio.wait_for(run(), 60))


def test_prompts_that_share_a_prefix_meet_on_one_engine_within_the_load_slack():
    routing = EngineRouting(RoutingPolicy.PREFIX, prefix_tokens=16, load_slack=2, load_slack_fraction=0.0)
    shared = TOKENIZER.encode("A long system prompt that many requests share, word for word, before their own question.")
    fmt = ResponseFormat.new("cmpl-x", "m", chat=False)

    async def run() -> None:
        engines = [SlowEngine() for _ in range(4)]
        detok = DetokClient(TOKENIZER.tokenizer, None, inline_threshold=0, tokens_per_call=1)
        client = EngineClient(engines, "sub", PromptEncoder(TOKENIZER), detok, IngressMetrics("tiny-random", "test-replica"), routing=routing)
        placed = []
        for question in ("Why?", "How?", "When?", "Where?"):
            submission = await client.submit(fmt, [shared + TOKENIZER.encode(question)], SamplingParams(), echo=False)
            placed.append(submission.streams[0].engine_index)
        home = placed[0]  # a new key: the least-loaded engine (all are at 0), now its home
        assert placed[:3] == [home] * 3  # 1, then 2 choices above the others: within the slack
        assert placed[3] != home  # 3 above: the prompt's next engine
        short = await client.submit(fmt, [TOKENIZER.encode("Hi")], SamplingParams(), echo=False)
        assert short.streams[0].engine_index not in placed  # no key: the least-loaded engine
        labels = {"model_name": "tiny-random", "replica": "test-replica"}
        counted = {p: client.metrics.registry.get_sample_value("spout:engine_routing_total", labels | {"placement": p}) for p in Placement}
        assert counted == {Placement.NEW_KEY: 1, Placement.AFFINITY: 2, Placement.SPILLED: 1, Placement.LEAST_LOADED: 1}

    asyncio.run(asyncio.wait_for(run(), 30))
