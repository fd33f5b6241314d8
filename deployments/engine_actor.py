"""`EngineActor`: one per GPU, runs `EngineCore` in its own thread and hands each
subscribed ingress replica one message per step with all of its requests' outputs."""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from engine.config import EngineConfig
from engine.core import EngineCore, InvalidRequestError
from engine.request import EngineOutput
from sampling.params import SamplingParams
from sampling.tokenized import TokenizedStrings

logger = logging.getLogger(__name__)
T = TypeVar("T")

SERVER_FULL = "the server is full: too many requests are waiting"


@dataclass(frozen=True)
class NewRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    strings: TokenizedStrings | None = None
    """The request's bad words, DRY breakers and negative prompt as ids (None: it has none)."""


class _Subscriber:
    """Outputs waiting for one ingress replica; they coalesce until it asks."""

    def __init__(self) -> None:
        self.outputs: list[EngineOutput] = []
        self.ready = asyncio.Event()


class EngineActor:
    """Wrap with ``ray.remote`` (see `deployments.app`); methods are called by ingress replicas.

    All engine work happens on one thread: calls are queued as commands and applied
    at the next step boundary, so nothing contends for a lock with the step loop.
    """

    def __init__(self, config: EngineConfig, max_waiting_requests: int) -> None:
        self.engine = EngineCore(config)
        self.max_waiting_requests = max_waiting_requests
        self.owners: dict[str, str] = {}  # request id -> subscriber; engine thread only
        self.subscribers: dict[str, _Subscriber] = {}  # event loop only
        self.commands: queue.SimpleQueue[tuple[Callable[[], Any], Future]] = queue.SimpleQueue()
        self.wakeup = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stopping = False
        self.num_steps = 0  # engine steps run; engine thread only
        self.thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self.thread.start()

    # --- called by ingress replicas -------------------------------------------------

    async def ready(self) -> int:
        """The engine's context length, once the model is loaded."""
        self.loop = asyncio.get_running_loop()
        return self.engine.max_model_len

    async def add_requests(self, subscriber: str, requests: list[NewRequest]) -> list[str | None]:
        """Queue requests whose outputs go to ``subscriber``; an error message per refused request."""
        self.loop = asyncio.get_running_loop()
        self.subscribers.setdefault(subscriber, _Subscriber())
        return await self._call(lambda: [self._add(subscriber, r) for r in requests])

    async def abort_requests(self, request_ids: list[str]) -> None:
        await self._call(lambda: self.engine.abort_requests(request_ids))

    async def get_outputs(self, subscriber: str, timeout_s: float = 1.0) -> list[EngineOutput]:
        """Everything produced for ``subscriber`` since its last call; waits up to ``timeout_s`` for some."""
        self.loop = asyncio.get_running_loop()
        mailbox = self.subscribers.setdefault(subscriber, _Subscriber())
        try:
            await asyncio.wait_for(mailbox.ready.wait(), timeout_s)
        except TimeoutError:
            return []
        mailbox.ready.clear()
        outputs, mailbox.outputs = mailbox.outputs, []
        return outputs

    async def stats(self) -> dict[str, int]:
        engine = self.engine
        return await self._call(
            lambda: {
                "running": engine.num_running,
                "waiting": engine.num_waiting,
                "generated_tokens": engine.num_generated_tokens,
                "draft_tokens": engine.num_draft_tokens,
                "accepted_tokens": engine.num_accepted_tokens,
                "steps": self.num_steps,
            }
        )

    async def num_generated(self, request_ids: list[str]) -> dict[str, int]:
        """Tokens generated per request (live or recently finished), from the engine's own counters."""
        return await self._call(lambda: {r: self.engine.num_generated(r) for r in request_ids})

    async def shutdown(self) -> None:
        """Stop the engine thread after its current step (for in-process use; Ray ends the process)."""
        self.stopping = True
        self.wakeup.set()
        await asyncio.to_thread(self.thread.join)

    # --- engine thread ----------------------------------------------------------------

    async def _call(self, command: Callable[[], T]) -> T:
        future: Future = Future()
        self.commands.put((command, future))
        self.wakeup.set()
        return await asyncio.wrap_future(future)

    def _add(self, subscriber: str, request: NewRequest) -> str | None:
        if self.engine.num_waiting >= self.max_waiting_requests:
            return SERVER_FULL
        try:
            self.engine.add_request(request.request_id, request.prompt_token_ids, request.params, request.strings)
        except InvalidRequestError as error:
            return str(error)
        self.owners[request.request_id] = subscriber
        return None

    def _run(self) -> None:
        try:
            while not self.stopping:
                self.wakeup.wait()
                self.wakeup.clear()
                self._apply_commands()
                while self.engine.has_unfinished_requests() and not self.stopping:
                    self._publish(self.engine.step())
                    self.num_steps += 1
                    self._apply_commands()
        except BaseException:
            # A request's own failure is an error output, never raised by step(): what is raised
            # belongs to no single request (device, memory, the batched pass) and leaves the engine
            # in an unknown state, so end the process; Ray restarts the actor and ingresses fail
            # its requests with an error frame.
            logger.exception("engine step failed; restarting the engine actor")
            os._exit(1)

    def _apply_commands(self) -> None:
        while True:
            try:
                command, future = self.commands.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue  # the caller was cancelled (e.g. its HTTP client left) before the command ran
            try:
                future.set_result(command())
            except Exception as error:  # the caller gets it; the loop goes on
                future.set_exception(error)

    def _publish(self, outputs: list[EngineOutput]) -> None:
        grouped: dict[str, list[EngineOutput]] = {}
        for output in outputs:
            owner = self.owners.pop(output.request_id) if output.finish_reason else self.owners.get(output.request_id)
            if owner is not None:
                grouped.setdefault(owner, []).append(output)
        if grouped and self.loop is not None:
            self.loop.call_soon_threadsafe(self._deliver, grouped)

    def _deliver(self, grouped: dict[str, list[EngineOutput]]) -> None:
        for subscriber, outputs in grouped.items():
            mailbox = self.subscribers.setdefault(subscriber, _Subscriber())
            mailbox.outputs.extend(outputs)
            mailbox.ready.set()
