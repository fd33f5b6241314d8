"""`SharedCheck`: concurrent and repeated /health calls share one engine check per period."""

from __future__ import annotations

import asyncio

import pytest

from deployments.health import SharedCheck


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_callers_within_the_period_share_one_check():
    clock = FakeClock()

    async def engine_check() -> None:
        await asyncio.sleep(0.01)

    shared = SharedCheck(engine_check, max_age_s=1.0, clock=clock)

    async def run() -> None:
        await asyncio.gather(*(shared() for _ in range(100)))  # all during one check
        clock.now = 0.9
        await shared()
        assert shared.num_checks == 1
        clock.now = 1.5  # the period is over
        await asyncio.gather(shared(), shared())
        assert shared.num_checks == 2

    asyncio.run(run())


def test_a_failed_check_fails_every_caller_of_its_period_then_is_retried():
    clock = FakeClock()
    healthy = False

    async def engine_check() -> None:
        if not healthy:
            raise TimeoutError("engine 0 did not answer")

    shared = SharedCheck(engine_check, max_age_s=1.0, clock=clock)

    async def run() -> None:
        nonlocal healthy
        for _ in range(3):
            with pytest.raises(TimeoutError, match="engine 0"):
                await shared()
        assert shared.num_checks == 1
        healthy, clock.now = True, 2.0
        await shared()
        assert shared.num_checks == 2

    asyncio.run(run())
