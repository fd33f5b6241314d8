"""What the ingress keeps per request: each choice's detok state, and a mailbox of coalesced deltas."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from deployments.openai.errors import APIError
from deployments.openai.logprobs import LogprobEntry, PromptLogprobEntries
from deployments.openai.output_events import ChoiceDelta
from detok import DetokState


class Mailbox:
    """The deltas of one HTTP request's choices; a slow reader gets them coalesced.

    The reader is woken for a choice's first delta, once ``stream_interval`` tokens
    wait for one choice, when a choice finishes, and on error (vLLM's ``stream_interval``):
    with an interval of n, a stream sends about one frame per n tokens.

    The idle timeout costs no timer per take: one timer per mailbox, armed by the first take
    that waits and re-armed (from the last output) only when it fires, so at most once per
    ``idle_timeout_s``; `close` cancels it.

    With a ``reader``, deltas that would wake the waiting take are offered to it first, in the
    pusher's call (the router's loop): when it takes them (`take_now`) and returns True, no task
    wakes. A choice's finish, an error, and deltas pushed while the take is already woken always
    go to the take, so that it sees everything after what the reader took, in order.
    """

    def __init__(self, stream_interval: int = 1, idle_timeout_s: float | None = None) -> None:
        self.stream_interval = stream_interval
        self.idle_timeout_s = idle_timeout_s
        self.pending: dict[int, ChoiceDelta] = {}
        self.started: set[int] = set()
        self.error: APIError | None = None
        self.ready = asyncio.Event()
        self.waiting = False
        self.last_output = 0.0
        """`time.monotonic` of the last push, or of the start of the last take."""
        self.idle_timer: asyncio.TimerHandle | None = None
        self.reader: Callable[[Mailbox], bool] | None = None

    def push(
        self,
        index: int,
        text: str,
        token_ids: list[int],
        finish_reason: str | None,
        stop_reason: int | str | None,
        logprobs: list[LogprobEntry] | None,
        prompt_logprobs: PromptLogprobEntries | None = None,
    ) -> None:
        delta = self.pending.get(index)
        if delta is None:
            delta = self.pending[index] = ChoiceDelta()
        delta.text += text
        delta.token_ids += token_ids  # copies: the engine's list is not kept
        if logprobs is not None:
            delta.logprobs = (delta.logprobs or []) + logprobs
        if prompt_logprobs is not None:
            delta.prompt_logprobs = prompt_logprobs
        delta.finish_reason, delta.stop_reason = finish_reason, stop_reason
        if self.idle_timer is not None:
            self.last_output = time.monotonic()
        if finish_reason is not None or len(delta.token_ids) >= self.stream_interval or index not in self.started:
            if finish_reason is None and self.reader is not None and not self.ready.is_set() and self.error is None and self.reader(self):
                return
            self.ready.set()

    def fail(self, error: APIError) -> None:
        self.error = error
        self.ready.set()

    def close(self) -> None:
        """The request is over: its idle timer goes."""
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None

    def _check_idle(self) -> None:
        """The idle timer fired: a waiting take without output for ``idle_timeout_s`` fails; else
        the timer is armed again from the last output, or dropped when no take waits."""
        assert self.idle_timeout_s is not None
        self.idle_timer = None
        if not self.waiting:
            return
        left = self.last_output + self.idle_timeout_s - time.monotonic()
        if left > 0:
            self.idle_timer = asyncio.get_running_loop().call_later(left, self._check_idle)
        elif self.error is None:
            self.fail(APIError(504, f"no output for {self.idle_timeout_s:g} s (stream_idle_timeout_s)", code="stream_timeout"))

    async def take(self) -> dict[int, ChoiceDelta]:
        """Wait for deltas and return them all; raises the request's error if it failed, and a 504
        ``stream_timeout`` after ``idle_timeout_s`` without any (a lost engine message never leaves
        the client waiting forever)."""
        if not self.ready.is_set():
            if self.idle_timeout_s is not None:
                self.last_output = time.monotonic()
                if self.idle_timer is None:
                    self.idle_timer = asyncio.get_running_loop().call_later(self.idle_timeout_s, self._check_idle)
            self.waiting = True
            try:
                await self.ready.wait()
            finally:
                self.waiting = False
        self.ready.clear()
        if self.error is not None:
            raise self.error
        return self.take_now()

    def take_now(self) -> dict[int, ChoiceDelta]:
        """The deltas waiting now (none, if none), without waiting."""
        pending, self.pending = self.pending, {}
        self.started.update(pending)
        return pending


@dataclass
class ChoiceStream:
    """One choice (``index``) of an HTTP request, routed to ``engine_index``: an engine request, or a
    beam of one (``search_id``); ``incarnation``: the engine's, once the add has been answered."""

    request_id: str
    index: int
    engine_index: int
    mailbox: Mailbox
    detok_state: DetokState
    finished: bool = False
    incarnation: int | None = None
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    search_id: str | None = None
    """The beam search this choice is a beam of, one engine request for all its beams; None: its own request."""

    @property
    def engine_request_id(self) -> str:
        """The engine request to abort when the choice is no longer wanted."""
        return self.search_id or self.request_id
