"""`ConstrainedRequests`: the engine's side of structured outputs, between `EngineCore` and llguidance.

A constrained request whose grammar is cached gets its matcher at once. Otherwise it waits
here while its grammar compiles on the worker (it is not yet scheduled, so it holds no slot,
and it is not counted among the engine's waiting requests: the compile budget bounds these),
then carries its matcher. Each step, the matchers of the step's constrained requests start
filling their bitmasks before the forward pass is launched (`start_masks`), and take the
step's accepted tokens when its results are in.
"""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, wait

from engine.grammar.compiler import CompileJob, GrammarCompiler
from engine.grammar.limits import CompileBudget, GrammarLimits
from engine.grammar.masks import ConstrainedRows, MaskFiller, PendingMasks
from engine.request import Request
from engine.scheduler import ScheduledStep
from engine.tokenizer import TextTokenizer


class ConstrainedRequests:
    def __init__(self, tokenizer: TextTokenizer, vocab_size: int, cache_size: int, limits: GrammarLimits, budget: CompileBudget) -> None:
        self.compiler = GrammarCompiler(tokenizer, vocab_size, cache_size, limits, budget)
        self.filler = MaskFiller(vocab_size)
        self.compiling: dict[Request, CompileJob] = {}
        """The requests waiting for their grammar, and its compile (on the worker)."""

    def submit(self, request: Request, client: str) -> bool:
        """Give the request its matcher, or start (or join) its grammar's compile: True when it then
        waits here until `compiled` hands it out. Raises `CompilesBusyError` (nothing changed) when
        ``client``'s or the engine's budget of uncached compiles is spent."""
        assert request.params.structured_outputs is not None
        matcher = self.compiler.matcher(request.params.structured_outputs, client)
        if not isinstance(matcher, CompileJob):
            request.grammar = matcher
            return False
        self.compiling[request] = matcher
        return True

    def wait(self, timeout_s: float) -> None:
        """Block until a grammar finishes compiling or ``timeout_s`` passes (an engine with nothing else to do)."""
        wait([job.future for job in self.compiler.jobs.values()], timeout_s, FIRST_COMPLETED)

    def compiled(self) -> tuple[list[Request], list[tuple[Request, Exception]]]:
        """The requests whose grammars are ready (handed out, now with their matchers) and those whose
        compile failed or ran past the deadline, with why (still here: the engine finishes them, which `discard`s them)."""
        self.compiler.reap(time.monotonic())
        ready, failed = [], []
        for request, job in list(self.compiling.items()):
            if job.timed_out:
                failed.append((request, self.compiler.timeout_error()))
                continue
            if not job.future.done():
                continue
            try:
                request.grammar = self.compiler.fresh(job)
            except Exception as error:
                failed.append((request, error))
                continue
            del self.compiling[request]
            ready.append(request)
        return ready, failed

    def discard(self, request: Request) -> bool:
        """Forget a request still compiling (aborted); False if it is not here. Its job runs on for the others that wait for it."""
        return self.compiling.pop(request, None) is not None

    def start_masks(self, step: ScheduledStep) -> PendingMasks | None:
        """Start filling the bitmasks of the step's constrained requests (None: it has none)."""
        entries, first_row = [], 0
        for request, drafts in zip(step.sampled, step.draft_token_ids):
            if request.grammar is not None:
                entries.append(ConstrainedRows(request.grammar, first_row, drafts))
            first_row += len(drafts) + 1
        return self.filler.start(entries) if entries else None
