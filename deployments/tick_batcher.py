"""`TickBatcher`: items submitted in the same event-loop tick go out in one call."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class TickBatcher(Generic[Item, Result]):
    """Collects items until the current tick ends, then sends them with one ``send`` call.

    No timer: the first item waits only for the tick it was submitted in, so batching
    never delays a lone request.
    """

    def __init__(self, send: Callable[[list[Item]], Awaitable[list[Result]]]) -> None:
        self.send = send
        self.items: list[Item] = []
        self.futures: list[asyncio.Future[Result]] = []

    def submit(self, item: Item) -> asyncio.Future[Result]:
        loop = asyncio.get_running_loop()
        if not self.items:
            # An empty context: Ray would otherwise take the call for a child of the submitting
            # request's task and cancel it, and so every item of the batch, when that request is
            # cancelled (its client left); see ray-project/ray#52476.
            loop.call_soon(lambda: loop.create_task(self._flush()), context=contextvars.Context())
        future: asyncio.Future[Result] = loop.create_future()
        self.items.append(item)
        self.futures.append(future)
        return future

    async def _flush(self) -> None:
        items, futures = self.items, self.futures
        self.items, self.futures = [], []
        try:
            results = await self.send(items)
        except Exception as error:
            for future in futures:
                if not future.done():
                    future.set_exception(error)
            return
        for future, result in zip(futures, results):
            if not future.done():
                future.set_result(result)
