"""Credit-based stepping in-process: the engine waits for its subscribers' acknowledgements,
so an abort sent with the next poll lands within two steps, and a silent subscriber is not
waited for beyond `CREDIT_WAIT_S`."""

from __future__ import annotations

import asyncio
import threading

from deployments.engine_actor import LEAD_STEPS, EngineActor, NewRequest
from deployments.step_credits import StepCredits
from engine.config import EngineConfig
from sampling.params import SamplingParams

LONG = SamplingParams(temperature=0.0, max_tokens=10_000, ignore_eos=True)
SHORT = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


def test_a_step_waits_for_the_acknowledgement_of_the_step_lead_steps_before():
    credits = StepCredits(lead_steps=3, wait_s=30.0)
    credits.published(["a"], 0)
    credits.published(["a"], 1)
    assert credits.wait_to_start(2) == []  # steps 0 and 1 may still be unacknowledged
    acknowledge = threading.Timer(0.05, credits.acknowledged, ("a", 0))
    acknowledge.start()
    assert credits.wait_to_start(3) == []  # returned once step 0 was acknowledged
    acknowledge.join()
    assert list(credits.unacknowledged["a"]) == [1]


def test_a_late_subscriber_is_excused_until_it_acknowledges_again():
    credits = StepCredits(lead_steps=3, wait_s=0.01)
    credits.published(["a", "b"], 0)
    credits.acknowledged("b", 0)
    assert credits.wait_to_start(3) == ["a"]
    credits.published(["a"], 3)
    assert credits.wait_to_start(6) == []  # "a" is not waited for
    credits.acknowledged("a", 3)
    credits.published(["a"], 6)
    assert credits.wait_to_start(9) == ["a"]


async def started_actor() -> EngineActor:
    actor = EngineActor(EngineConfig(model="tiny-random", max_num_seqs=4, max_model_len=20_000), max_waiting_requests=8)
    await actor.ready()
    return actor


def test_an_abort_sent_with_the_next_poll_lands_within_two_steps_of_the_last_output_taken():
    """The subscriber routes each message for longer than a step takes (a slow ingress); the
    engine waits for it instead of running ahead."""

    async def run() -> tuple[int, int]:
        actor = await started_actor()
        try:
            await actor.add_requests("a", [NewRequest("r", [1, 2], LONG)])
            taken, aborts = 0, []
            while not aborts:
                polled = await actor.get_outputs("a", 5.0, [])
                taken += sum(len(o.new_token_ids) for o in polled.outputs)
                await asyncio.sleep(0.02)  # routing
                if taken >= 5:
                    aborts = ["r"]  # e.g. a stop string completed in the last output taken
            finished = False
            while not finished:
                polled = await actor.get_outputs("a", 5.0, aborts)
                aborts = []
                finished = any(o.finish_reason is not None for o in polled.outputs)
            return taken, (await actor.num_generated(["r"]))["r"]
        finally:
            await actor.shutdown()

    taken, generated = asyncio.run(asyncio.wait_for(run(), 60))
    assert generated - taken <= LEAD_STEPS - 1


def test_a_subscriber_that_never_polls_does_not_stop_the_engine():
    async def run() -> tuple[int, int]:
        actor = await started_actor()
        try:
            await actor.add_requests("mute", [NewRequest("m", [1, 2], LONG)])
            await actor.add_requests("b", [NewRequest("b", [3, 4], SHORT)])
            tokens, finished = 0, False
            while not finished:
                outputs = (await actor.get_outputs("b", 5.0, [])).outputs
                tokens += sum(len(o.new_token_ids) for o in outputs)
                finished = any(o.finish_reason is not None for o in outputs)
            return tokens, (await actor.stats())["late_subscribers"]
        finally:
            await actor.shutdown()

    tokens, late = asyncio.run(asyncio.wait_for(run(), 60))
    assert tokens == SHORT.max_tokens
    assert late >= 1
