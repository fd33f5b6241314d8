"""`EngineActor`: one per GPU, runs `EngineCore` in its own thread and hands each
subscribed ingress replica one message per step with all of its requests' outputs. Its replicas
poll, add and abort on the connections `deployments.engine_channel` serves; stats and the
channel's address are Ray calls.

Every reply carries the actor's incarnation, a random number drawn when it starts, so an
ingress sees a restart (Ray restarts a dead actor under the same name) in the first reply
after it, not only in a failed call. A subscriber that has not polled for
``SUBSCRIBER_TIMEOUT_S`` is taken for dead: its requests are aborted and its mailbox dropped;
should it poll again, the reply says so (``Polled.subscriber_lost``) and it ends those streams.

A subscriber's aborts come with its next poll, and the engine runs at most `LEAD_STEPS` steps
ahead of the outputs its subscribers have routed (`StepCredits`), so a request whose stop
string or client's leaving shows in step k's outputs gets at most ``LEAD_STEPS - 1`` more steps.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import ray
from ray.actor import ActorProxy

from deployments.engine_channel import ChannelAddress, ChannelServer, EngineMethod
from deployments.output_columns import from_columns, to_columns
from deployments.startup_heap import freeze_startup_heap
from deployments.step_credits import StepCredits
from engine.config import EngineConfig
from engine.core import EngineCore, InvalidRequestError
from engine.grammar.compiler import CompileLimit, CompilesBusyError
from engine.outputs import EngineOutput
from sampling.params import SamplingParams
from sampling.tokenized import TokenizedStrings

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Refusal:
    """Why the engine did not take a request, as the HTTP error its client gets."""

    status: int
    message: str
    code: str | None = None


SERVER_FULL = Refusal(503, "the server is full: too many requests are waiting", "server_full")
ABORTED = Refusal(499, "the request was aborted before it was admitted", "client_closed_request")
COMPILES_BUSY_STATUS = {CompileLimit.PER_CLIENT: 429, CompileLimit.PER_ENGINE: 503}
"""A client over its own share of compiles is told to slow down; a busy engine, to retry later."""
SUBSCRIBER_TIMEOUT_S = 30.0  # far above the ingress's 1 s long poll
RECENT_ABORTS = 65536  # ids aborted before their add arrived, remembered so that the add is refused
# Step j waits for step j - 3's outputs to be routed: at most 2 steps of abort waste (one more
# where `EngineCore.step` returns the previous step's outputs, i.e. async scheduling on CUDA).
LEAD_STEPS = 3
CREDIT_WAIT_S = 0.5  # a subscriber that takes longer is not waited for until its next poll


@dataclass(frozen=True)
class NewRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    strings: TokenizedStrings | None = None
    """The request's bad words, DRY breakers and negative prompt as ids (None: it has none)."""
    client: str = ""
    """Who sent it, as the ingress knows them: whose share of the engine's grammar compiles it uses."""
    client_id: str | None = None
    """The client's own name for its share of the queue under the priority policy (else ``client``)."""


@dataclass(frozen=True)
class Added:
    """`EngineActor.add_requests`'s reply: why each request was refused (None: queued)."""

    incarnation: int
    errors: list[Refusal | None]


@dataclass(frozen=True)
class Polled:
    """`EngineActor.get_outputs`'s reply; pickled with its outputs as columns (`deployments.output_columns`)."""

    incarnation: int
    outputs: list[EngineOutput]
    subscriber_lost: bool = False
    """The engine had taken the subscriber for dead and aborted its requests (its streams must end)."""

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return _polled, (self.incarnation, self.subscriber_lost, *to_columns(self.outputs))


def _polled(incarnation: int, subscriber_lost: bool, *columns: object) -> Polled:
    return Polled(incarnation, from_columns(*columns), subscriber_lost)  # type: ignore[arg-type]


class _Subscriber:
    """Outputs waiting for one ingress replica; they coalesce until it asks."""

    def __init__(self) -> None:
        self.outputs: list[EngineOutput] = []
        self.ready = asyncio.Event()
        self.last_seen = time.monotonic()  # its last poll (adding requests does not count)
        self.delivered_step = -1  # the last engine step whose outputs are in `outputs`
        self.taken_step = -1  # the last step the subscriber took (its next poll acknowledges it)


class EngineActor:
    """Wrap with ``ray.remote`` (see `deployments.engine_placement.engine_handles`); the methods marked ``@ray.method`` are
    called through an `EngineHandle`, which types their ``.remote`` calls; `get_outputs`, `add_requests` and
    `abort_requests` are served to ingress replicas on the engine channel (`deployments.engine_channel`).

    All engine work happens on one thread: calls are queued as commands and applied
    at the next step boundary, so nothing contends for a lock with the step loop.
    """

    def __init__(self, config: EngineConfig, max_waiting_requests: int) -> None:
        self.incarnation = random.getrandbits(62)
        self.max_waiting_requests = max_waiting_requests
        self.owners: dict[str, str] = {}  # request id -> subscriber; engine thread only
        self.recent_aborts: OrderedDict[str, None] = OrderedDict()  # engine thread only
        self.subscribers: dict[str, _Subscriber] = {}  # event loop only
        self.reaped: set[str] = set()  # subscribers taken for dead that have not polled since; event loop only
        self.reaper: asyncio.Task | None = None
        calls = {EngineMethod.GET_OUTPUTS: self.get_outputs, EngineMethod.ADD_REQUESTS: self.add_requests, EngineMethod.ABORT_REQUESTS: self.abort_requests}
        self.channel = ChannelServer(calls, channel_host())
        self.commands: queue.SimpleQueue[tuple[Callable[[], Any], Future]] = queue.SimpleQueue()
        self.wakeup = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stopping = False
        self.num_steps = 0  # engine steps run; engine thread only
        self.credits = StepCredits(LEAD_STEPS, CREDIT_WAIT_S)
        self.num_late_subscribers = 0  # times a subscriber was not waited for; engine thread only
        self.step_seconds = 0.0  # in EngineCore.step; engine thread only
        self.delivery_wait_seconds = 0.0  # publishing outputs and waiting for their subscribers; engine thread only
        loaded: Future[EngineCore] = Future()
        self.thread = threading.Thread(target=self._run, args=(config, loaded), name="engine-loop", daemon=True)
        self.thread.start()
        self.engine = loaded.result()  # what loading raised, raised here
        freeze_startup_heap()

    def _load(self, config: EngineConfig) -> EngineCore:
        """The engine this actor runs (`bench.lib.synthetic_engine` overrides it with a model-free one)."""
        return EngineCore(config)

    # --- called by ingress replicas -------------------------------------------------

    @ray.method
    async def ready(self) -> int:
        """The engine's context length, once the model is loaded."""
        self._bind_loop()
        return self.engine.max_model_len

    async def add_requests(self, subscriber: str, requests: list[NewRequest]) -> Added:
        """Queue requests whose outputs go to ``subscriber``; why each refused request was refused."""
        self._subscriber(subscriber)
        return Added(self.incarnation, await self._call(lambda: [self._add(subscriber, r) for r in requests]))

    async def abort_requests(self, request_ids: list[str]) -> int:
        """Abort these requests (or, not added yet, refuse them when they are); the incarnation."""
        await self._call(lambda: self._abort(request_ids))
        return self.incarnation

    @ray.method
    async def channel_address(self) -> ChannelAddress:
        """Where a replica calls `get_outputs`, `add_requests` and `abort_requests` (`deployments.engine_channel`): on
        connections of its own, not a Ray call each."""
        self._bind_loop()
        return await self.channel.address()

    async def get_outputs(self, subscriber: str, timeout_s: float, aborts: list[str]) -> Polled:
        """Everything produced for ``subscriber`` since its last call; waits up to ``timeout_s`` for some.

        The call also aborts ``aborts`` (the subscriber found them while routing the outputs of its
        previous call) and so acknowledges that call's outputs: the engine may step on.
        """
        if subscriber in self.reaped:  # it was silent too long: its requests are gone, and it must know
            self.reaped.discard(subscriber)
            self._subscriber(subscriber)
            return Polled(self.incarnation, [], subscriber_lost=True)
        mailbox = self._subscriber(subscriber)
        mailbox.last_seen = time.monotonic()
        if aborts:
            self._enqueue(lambda: self._abort(aborts))  # before the acknowledgement lets the engine step
        self.credits.acknowledged(subscriber, mailbox.taken_step)
        try:
            await asyncio.wait_for(mailbox.ready.wait(), timeout_s)
        except TimeoutError:
            return Polled(self.incarnation, [])
        finally:
            mailbox.last_seen = time.monotonic()
        mailbox.ready.clear()
        outputs, mailbox.outputs = mailbox.outputs, []
        mailbox.taken_step = mailbox.delivered_step
        return Polled(self.incarnation, outputs)

    @ray.method
    async def stats(self) -> dict[str, float]:
        engine = self.engine
        return await self._call(
            lambda: {
                "incarnation": self.incarnation,
                "running": engine.num_running,
                "waiting": engine.num_waiting,
                "compiling": engine.num_compiling,
                "generated_tokens": engine.num_generated_tokens,
                "draft_tokens": engine.num_draft_tokens,
                "accepted_tokens": engine.num_accepted_tokens,
                "prefix_cache_queried_tokens": engine.prefix_cache_stats.queried_tokens,
                "prefix_cache_hit_tokens": engine.prefix_cache_stats.hit_tokens,
                "preemptions": engine.num_preemptions,
                "steps": self.num_steps,
                "step_seconds": self.step_seconds,
                "delivery_wait_seconds": self.delivery_wait_seconds,
                "subscribers": len(self.subscribers),
                "late_subscribers": self.num_late_subscribers,
            }
        )

    @ray.method
    async def num_generated(self, request_ids: list[str]) -> dict[str, int]:
        """Tokens generated per request (live or recently finished), from the engine's own counters."""
        return await self._call(lambda: {r: self.engine.num_generated(r) for r in request_ids})

    @ray.method
    async def shutdown(self) -> None:
        """Stop the engine thread after its current step (for in-process use; Ray ends the process)."""
        self.stopping = True
        self.wakeup.set()
        self.channel.close()
        if self.reaper is not None:
            self.reaper.cancel()
        await asyncio.to_thread(self.thread.join)

    # --- subscribers (event loop) -------------------------------------------------------

    def _bind_loop(self) -> None:
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
            self.reaper = self.loop.create_task(self._reap_dead_subscribers())

    def _subscriber(self, subscriber: str) -> _Subscriber:
        self._bind_loop()
        mailbox = self.subscribers.get(subscriber)
        if mailbox is None:
            mailbox = self.subscribers[subscriber] = _Subscriber()
        return mailbox

    async def _reap_dead_subscribers(self) -> None:
        """Abort the requests of subscribers silent for `SUBSCRIBER_TIMEOUT_S` (their ingress
        replica died) and drop their mailboxes."""
        while True:
            await asyncio.sleep(SUBSCRIBER_TIMEOUT_S / 4)
            now = time.monotonic()
            for subscriber in [s for s, m in self.subscribers.items() if now - m.last_seen > SUBSCRIBER_TIMEOUT_S]:
                logger.warning("subscriber %s has not polled for %.0f s: aborting its requests", subscriber, now - self.subscribers[subscriber].last_seen)
                del self.subscribers[subscriber]
                self.reaped.add(subscriber)
                self.credits.forget(subscriber)
                await self._call(lambda s=subscriber: self._abort([r for r, owner in self.owners.items() if owner == s]))

    # --- engine thread ----------------------------------------------------------------

    async def _call(self, command: Callable[[], T]) -> T:
        return await asyncio.wrap_future(self._enqueue(command))

    def _enqueue(self, command: Callable[[], T]) -> Future:
        """Run ``command`` on the engine thread before its next step."""
        future: Future = Future()
        self.commands.put((command, future))
        self.wakeup.set()
        return future

    def _add(self, subscriber: str, request: NewRequest) -> Refusal | None:
        if request.request_id in self.recent_aborts:
            del self.recent_aborts[request.request_id]
            return ABORTED
        if self.engine.num_waiting >= self.max_waiting_requests:
            return SERVER_FULL
        try:
            self.engine.add_request(request.request_id, request.prompt_token_ids, request.params, request.strings, request.client, request.client_id)
        except InvalidRequestError as error:
            return Refusal(400, str(error))
        except CompilesBusyError as error:
            return Refusal(COMPILES_BUSY_STATUS[error.limit], str(error), "grammar_compiles_busy")
        self.owners[request.request_id] = subscriber
        return None

    def _abort(self, request_ids: list[str]) -> None:
        """Abort running or queued requests; remember the others, whose add may still be on its way."""
        for request_id in request_ids:
            if request_id not in self.engine.requests:
                self.recent_aborts[request_id] = None
                if len(self.recent_aborts) > RECENT_ABORTS:
                    self.recent_aborts.popitem(last=False)
        self.engine.abort_requests(request_ids)

    def _run(self, config: EngineConfig, loaded: Future) -> None:
        # The model loads on the thread that steps it: torch's OpenMP parallel regions are fast
        # only on the first thread that opens one. A second thread gets a team of its own, and
        # its small ops run as slowly as with OMP_WAIT_POLICY=passive, each waiting for a
        # worker's wake-up (measured in-process: a 64-stream step in 185 ms on a second thread
        # against 122 ms; served, 227 ms before this and 163 ms after).
        try:
            engine = self._load(config)
        except BaseException as error:
            loaded.set_exception(error)
            return
        loaded.set_result(engine)  # __init__ sets self.engine before any call can wake this loop
        try:
            while not self.stopping:
                self.wakeup.wait()
                self.wakeup.clear()
                self._apply_commands()
                while self.engine.has_unfinished_requests() and not self.stopping:
                    started = time.perf_counter()
                    outputs = self.engine.step()
                    stepped = time.perf_counter()
                    self._publish(self.num_steps, outputs)
                    self.num_steps += 1
                    self.num_late_subscribers += len(self.credits.wait_to_start(self.num_steps))
                    self.step_seconds += stepped - started
                    self.delivery_wait_seconds += time.perf_counter() - stepped
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

    def _publish(self, step: int, outputs: list[EngineOutput]) -> None:
        grouped: dict[str, list[EngineOutput]] = {}
        for output in outputs:
            owner = self.owners.pop(output.request_id) if output.finish_reason else self.owners.get(output.request_id)
            if owner is not None:
                grouped.setdefault(owner, []).append(output)
        if grouped and self.loop is not None:
            self.credits.published([s for s in grouped if s in self.subscribers], step)
            self.loop.call_soon_threadsafe(self._deliver, step, grouped)

    def _deliver(self, step: int, grouped: dict[str, list[EngineOutput]]) -> None:
        for subscriber, outputs in grouped.items():
            mailbox = self.subscribers.get(subscriber)
            if mailbox is None:
                continue  # reaped: its ingress replica is gone
            mailbox.outputs.extend(outputs)
            mailbox.delivered_step = step
            mailbox.ready.set()


def channel_host() -> str:
    """The address the engine channel listens on: this node's, as Ray knows it (replicas may run on other
    nodes), or loopback outside Ray (in-process tests)."""
    return ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"


EngineHandle = ActorProxy[EngineActor]
"""A handle to an engine actor, as Ray types it: ``engine.channel_address.remote()`` is checked
against `EngineActor.channel_address`, and awaiting it gives a `ChannelAddress`."""
