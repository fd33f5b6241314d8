"""`SyntheticEngineActor` in-process (no Ray) obeys `EngineActor`'s interface: its replies, stats,
refusals, slots, lengths and aborts are what an ingress expects of a real engine."""

from __future__ import annotations

import asyncio

from bench.lib.synthetic_engine import FIRST_TOKEN_ID, StepRate, SyntheticEngineActor
from deployments.engine_actor import EngineActor, NewRequest, Polled
from engine.config import EngineConfig
from engine.outputs import FinishReason
from sampling.params import SamplingParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
RATE = StepRate(max_num_seqs=2, step_s=0.002, max_model_len=64)


async def _collect(actor: EngineActor, subscriber: str, count: int) -> tuple[dict[str, list[int]], dict[str, FinishReason], int]:
    """Tokens and finish reasons of ``count`` requests, and the most running at once."""
    tokens: dict[str, list[int]] = {}
    reasons: dict[str, FinishReason] = {}
    most_running = 0
    for _ in range(500):
        polled = await actor.get_outputs(subscriber, 5.0, [])
        assert isinstance(polled, Polled) and not polled.subscriber_lost
        most_running = max(most_running, (await actor.stats())["running"])
        for output in polled.outputs:
            tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
            if output.finish_reason is not None:
                reasons[output.request_id] = output.finish_reason
        if len(reasons) == count:
            return tokens, reasons, most_running
    raise AssertionError(f"only {len(reasons)} of {count} finished")


def test_the_synthetic_engine_answers_as_the_engine_actor_does():
    async def run() -> None:
        actor = SyntheticEngineActor(RATE, max_waiting_requests=8)
        real = EngineActor(EngineConfig(model="tiny-random", max_num_seqs=2, max_model_len=64), max_waiting_requests=8)
        try:
            assert await actor.ready() == RATE.max_model_len
            assert (await actor.stats()).keys() == (await real.stats()).keys()
            requests = [NewRequest(f"r{i}", [10 + i, 20], PARAMS) for i in range(3)]
            added = await actor.add_requests("ingress", [NewRequest("empty", [], PARAMS), NewRequest("long", [1] * 64, PARAMS), *requests])
            assert added.incarnation == actor.incarnation
            assert "0 tokens" in added.errors[0].message and "64 tokens" in added.errors[1].message and added.errors[2:] == [None, None, None]
            tokens, reasons, most_running = await _collect(actor, "ingress", 3)
            assert {r: len(t) for r, t in tokens.items()} == {"r0": 5, "r1": 5, "r2": 5}
            assert set(reasons.values()) == {FinishReason.LENGTH}
            assert most_running <= RATE.max_num_seqs
            assert all(FIRST_TOKEN_ID <= token for t in tokens.values() for token in t)
            assert await actor.num_generated(["r0"]) == {"r0": 5}
            long = SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)
            assert (await actor.add_requests("ingress", [NewRequest("endless", [1, 2], long)])).errors == [None]
            await actor.abort_requests(["endless"])
            _, reasons, _ = await _collect(actor, "ingress", 1)
            assert reasons == {"endless": FinishReason.ABORT}
        finally:
            await actor.shutdown()
            await real.shutdown()

    asyncio.run(asyncio.wait_for(run(), 60))


def test_a_request_that_asks_for_logprobs_gets_that_many_alternatives_per_token():
    async def run() -> None:
        actor = SyntheticEngineActor(RATE, max_waiting_requests=8)
        try:
            await actor.ready()
            asks = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logprobs=5)
            await actor.add_requests("ingress", [NewRequest("asks", [10, 20], asks), NewRequest("plain", [11, 20], PARAMS)])
            outputs = []
            while len([o for o in outputs if o.finish_reason is not None]) < 2:
                polled = await actor.get_outputs("ingress", 5.0, [])
                assert isinstance(polled, Polled)
                outputs += polled.outputs
            asked = [o for o in outputs if o.request_id == "asks"]
            assert sum(len(o.new_token_ids) for o in asked) == 3
            assert all(o.logprobs is not None and len(o.logprobs) == len(o.new_token_ids) for o in asked)
            assert all(len(entry.top_token_ids) == len(entry.top_logprobs) == 5 for o in asked for entry in o.logprobs)
            assert all(FIRST_TOKEN_ID <= token for o in asked for entry in o.logprobs for token in entry.top_token_ids)
            assert all(o.logprobs is None for o in outputs if o.request_id == "plain")
        finally:
            await actor.shutdown()

    asyncio.run(run())
