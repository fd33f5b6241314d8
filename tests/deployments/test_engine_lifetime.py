"""EngineActor's lifetime bookkeeping in-process (no Ray): the incarnation in every reply,
a silent subscriber's requests aborted, an abort that arrives before its add."""

from __future__ import annotations

import asyncio

import pytest

from deployments import engine_actor
from deployments.engine_actor import ABORTED, EngineActor, NewRequest
from engine.config import EngineConfig
from sampling.params import SamplingParams

LONG = SamplingParams(temperature=0.0, max_tokens=10_000, ignore_eos=True)
SHORT = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


async def started_actor() -> EngineActor:
    actor = EngineActor(EngineConfig(model="tiny-random", max_num_seqs=4, max_model_len=20_000), max_waiting_requests=8)
    await actor.ready()
    return actor


async def finish(actor: EngineActor, subscriber: str, request_id: str) -> int:
    """Poll ``subscriber``'s outputs until ``request_id`` finishes; its token count."""
    tokens = 0
    for _ in range(200):
        for output in (await actor.get_outputs(subscriber, 5.0, [])).outputs:
            if output.request_id == request_id:
                tokens += len(output.new_token_ids)
                if output.finish_reason is not None:
                    return tokens
    raise AssertionError(f"{request_id} did not finish")


async def poll_for(actor: EngineActor, subscriber: str, seconds: float, also_add_for: str | None = None) -> None:
    """Poll as ``subscriber`` for ``seconds``; meanwhile ``also_add_for`` adds (nothing) without polling."""
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    while loop.time() < until:
        await actor.get_outputs(subscriber, 0.05, [])
        if also_add_for is not None:
            await actor.add_requests(also_add_for, [])


def test_every_reply_carries_the_same_incarnation_and_a_new_actor_draws_another():
    async def run() -> tuple[set[int], int]:
        actor, other = await started_actor(), await started_actor()
        try:
            added = await actor.add_requests("a", [NewRequest("r", [1, 2], SHORT)])
            polled = await actor.get_outputs("a", 5.0, [])
            seen = {added.incarnation, polled.incarnation, await actor.abort_requests(["r"]), (await actor.stats())["incarnation"]}
            return seen, (await other.stats())["incarnation"]
        finally:
            await actor.shutdown()
            await other.shutdown()

    seen, other = asyncio.run(run())
    assert len(seen) == 1 and other not in seen


def test_a_silent_subscribers_requests_are_aborted_and_its_mailbox_dropped(monkeypatch: pytest.MonkeyPatch):
    # Above CREDIT_WAIT_S: "gone"'s adds wait for a step boundary, which may wait that long for
    # "gone" to take its outputs, and meanwhile "alive" cannot poll.
    monkeypatch.setattr(engine_actor, "SUBSCRIBER_TIMEOUT_S", 2 * engine_actor.CREDIT_WAIT_S)

    async def run() -> None:
        actor = await started_actor()
        try:
            assert (await actor.add_requests("gone", [NewRequest("g", [1, 2], LONG)])).errors == [None]
            assert (await actor.add_requests("alive", [NewRequest("a", [3, 4], LONG)])).errors == [None]
            await poll_for(actor, "alive", 2.5, also_add_for="gone")  # "gone" only adds, which does not count
            assert (await actor.stats())["running"] == 1  # "g" was aborted
            await poll_for(actor, "alive", 1.5)
            assert (await actor.stats())["subscribers"] == 1
            assert "gone" not in actor.subscribers
            assert actor.engine.num_generated("g") < LONG.max_tokens
            assert (await actor.get_outputs("gone", 0.05, [])).subscriber_lost  # told once, when it comes back
            assert not (await actor.get_outputs("gone", 0.05, [])).subscriber_lost
        finally:
            await actor.shutdown()

    asyncio.run(run())


def test_an_abort_that_arrives_before_its_add_wins():
    async def run() -> None:
        actor = await started_actor()
        try:
            assert await actor.abort_requests(["early"]) == actor.incarnation
            added = await actor.add_requests("a", [NewRequest("early", [1, 2], LONG), NewRequest("other", [1, 2], SHORT)])
            assert added.errors == [ABORTED, None]
            assert await finish(actor, "a", "other") == SHORT.max_tokens
            stats = await actor.stats()
            assert (stats["running"], stats["waiting"]) == (0, 0)
        finally:
            await actor.shutdown()

    asyncio.run(run())
