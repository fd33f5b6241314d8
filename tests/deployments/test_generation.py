"""`Generation.submit` in-process, against a fake engine handle: a client that leaves while its
request is being added leaves nothing behind in the ingress or the engine."""

from __future__ import annotations

import asyncio

from deployments.detok_pool import DetokClient
from deployments.generation import Generation
from deployments.metrics import IngressMetrics
from deployments.responses import ResponseFormat
from engine.loader.checkpoint import DEFAULT_MODEL, load_tokenizer
from sampling.params import SamplingParams

TOKENIZER = load_tokenizer(DEFAULT_MODEL)


class _Remote:
    """Stands for a Ray actor method: ``.remote(...)`` returns an awaitable."""

    def __init__(self, method) -> None:
        self.method = method

    def remote(self, *args):
        return self.method(*args)


class SlowEngine:
    """Adds after a delay (the caller may be gone by then) and records every call."""

    def __init__(self) -> None:
        self.added: list[str] = []
        self.aborted: list[str] = []
        self.add_requests = _Remote(self._add)
        self.abort_requests = _Remote(self._abort)
        self.get_outputs = _Remote(self._outputs)

    async def _add(self, subscriber: str, requests: list) -> list[None]:
        await asyncio.sleep(0.05)
        self.added += [r.request_id for r in requests]
        return [None] * len(requests)

    async def _abort(self, request_ids: list[str]) -> None:
        self.aborted += request_ids

    async def _outputs(self, subscriber: str, timeout_s: float) -> list:
        await asyncio.sleep(timeout_s)
        return []


def test_a_submit_cancelled_mid_add_unregisters_and_aborts_its_choices():
    async def run() -> tuple[SlowEngine, int]:
        engine = SlowEngine()
        detok = DetokClient(TOKENIZER.tokenizer, None, inline_threshold=0, max_split=1)
        generation = Generation([engine], "sub", TOKENIZER, detok, IngressMetrics())
        fmt = ResponseFormat.new("cmpl-x", "m", chat=False)
        submit = asyncio.create_task(generation.submit(fmt, [TOKENIZER.encode("Hello")], SamplingParams(n=2), echo=False))
        await asyncio.sleep(0.01)  # the add is in flight
        submit.cancel()
        await asyncio.gather(submit, return_exceptions=True)
        await asyncio.sleep(0.1)  # the add lands, then the aborts go out
        return engine, len(generation.router.streams)

    engine, live = asyncio.run(run())
    assert live == 0
    assert engine.added == ["cmpl-x-0", "cmpl-x-1"]
    assert sorted(engine.aborted) == engine.added
