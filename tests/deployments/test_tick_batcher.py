"""`TickBatcher`: one call per tick, made outside the context of any submitter."""

from __future__ import annotations

import asyncio
import contextvars

from deployments.tick_batcher import TickBatcher

REQUEST = contextvars.ContextVar("request", default=None)


def test_one_call_per_tick_outside_every_submitters_context():
    """Ray takes an actor call for a child of the task whose context made it, and cancels it
    with that task (ray-project/ray#52476): a batch must belong to none of its submitters."""
    calls: list[tuple[list[int], str | None]] = []

    async def send(items: list[int]) -> list[int]:
        calls.append((items, REQUEST.get()))
        return [item * 2 for item in items]

    async def run() -> list[int]:
        batcher = TickBatcher(send)

        async def submit(item: int) -> int:
            REQUEST.set(f"request-{item}")
            return await batcher.submit(item)

        return await asyncio.gather(*(submit(i) for i in range(3)))

    assert asyncio.run(run()) == [0, 2, 4]
    assert calls == [([0, 1, 2], None)]


def test_a_cancelled_submitter_leaves_the_others_their_results():
    async def send(items: list[int]) -> list[int]:
        await asyncio.sleep(0.01)
        return [item * 2 for item in items]

    async def run() -> list[object]:
        batcher = TickBatcher(send)
        tasks = [asyncio.create_task(asyncio.wait_for(batcher.submit(i), 5)) for i in range(3)]
        await asyncio.sleep(0)
        tasks[1].cancel()
        return await asyncio.gather(*tasks, return_exceptions=True)

    results = asyncio.run(run())
    assert results[0] == 0 and results[2] == 4
    assert isinstance(results[1], asyncio.CancelledError)
