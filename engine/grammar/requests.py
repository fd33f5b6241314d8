"""`ConstrainedRequests`: the engine's side of structured outputs, between `EngineCore` and llguidance.

A constrained request waits here while its grammar compiles on the worker (it is not yet
scheduled, so it holds no slot); once compiled it carries its matcher. Each step, the matchers
of the step's constrained requests start filling their bitmasks before the forward pass is
launched (`start_masks`), and take the step's accepted tokens when its results are in.
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, wait

from engine.grammar.compiler import GrammarCompiler
from engine.grammar.masks import ConstrainedRows, MaskFiller, PendingMasks
from engine.request import Request
from engine.scheduler import ScheduledStep
from engine.tokenizer import TextTokenizer


class ConstrainedRequests:
    def __init__(self, tokenizer: TextTokenizer, vocab_size: int, cache_size: int) -> None:
        self.compiler = GrammarCompiler(tokenizer, vocab_size, cache_size)
        self.filler = MaskFiller(vocab_size)
        self.compiling: dict[str, Request] = {}

    def submit(self, request: Request) -> None:
        """Start compiling the request's grammar; it waits here until `compiled` hands it out."""
        assert request.params.structured_outputs is not None
        request.pending_grammar = self.compiler.submit(request.params.structured_outputs)
        self.compiling[request.request_id] = request

    def wait(self, timeout_s: float) -> None:
        """Block until a grammar finishes compiling or ``timeout_s`` passes (an engine with nothing else to do)."""
        wait([r.pending_grammar for r in self.compiling.values() if r.pending_grammar is not None], timeout_s, FIRST_COMPLETED)

    def compiled(self) -> tuple[list[Request], list[tuple[Request, Exception]]]:
        """The requests whose grammars are ready (handed out, now with their matchers) and those whose
        compile failed, with why (still here: the engine finishes them, which `discard`s them)."""
        ready, failed = [], []
        for request_id, request in list(self.compiling.items()):
            future = request.pending_grammar
            assert future is not None
            if not future.done():
                continue
            error = future.exception()
            if error is not None:
                failed.append((request, error))
                continue
            del self.compiling[request_id]
            request.pending_grammar = None
            request.grammar = future.result()
            ready.append(request)
        return ready, failed

    def discard(self, request: Request) -> bool:
        """Forget a request still compiling (aborted); False if it is not here."""
        if self.compiling.pop(request.request_id, None) is None:
            return False
        assert request.pending_grammar is not None
        request.pending_grammar.cancel()
        request.pending_grammar = None
        return True

    def start_masks(self, step: ScheduledStep) -> PendingMasks | None:
        """Start filling the bitmasks of the step's constrained requests (None: it has none)."""
        entries, first_row = [], 0
        for request, drafts in zip(step.sampled, step.draft_token_ids):
            if request.grammar is not None:
                entries.append(ConstrainedRows(request.grammar, first_row, drafts))
            first_row += len(drafts) + 1
        return self.filler.start(entries) if entries else None
