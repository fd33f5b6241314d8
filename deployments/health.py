"""`SharedCheck`: one health check answers every caller for a while.

``/health`` needs no API key, so anyone may call it as often as they like; each call checking
every engine would cost an actor round trip per call. Callers within ``max_age_s`` of the last
check get its outcome (success, or the same error), and callers during a check wait for that one.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Awaitable, Callable


class SharedCheck:
    def __init__(self, check: Callable[[], Awaitable[None]], max_age_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.check, self.max_age_s, self.clock = check, max_age_s, clock
        self.num_checks = 0
        self._outcome: BaseException | None = None
        self._checked_at: float | None = None
        self._running: asyncio.Task[None] | None = None

    async def __call__(self) -> None:
        """Return if the last check (at most ``max_age_s`` old) passed; raise its error if it failed."""
        if self._checked_at is None or self.clock() - self._checked_at > self.max_age_s:
            if self._running is None:
                # An empty context: a server that cancels a request's tasks (Ray) does not cancel the check with its first caller.
                self._running = asyncio.get_running_loop().create_task(self._run(), context=contextvars.Context())
            await asyncio.shield(self._running)
        if self._outcome is not None:
            raise self._outcome

    async def _run(self) -> None:
        self.num_checks += 1
        try:
            await self.check()
            self._outcome = None
        except Exception as error:  # the outcome every caller of this period gets
            self._outcome = error
        finally:
            self._checked_at, self._running = self.clock(), None
