"""`GrammarCompiler`: structured-output constraints compiled on a worker thread, one job per grammar, cached.

llguidance compiles when a matcher is made (it drops the GIL meanwhile) and builds its lexer
at the first mask; both happen on the worker, so a slow grammar delays only the requests that
wait for it, never the engine's step loop. A compiled matcher is kept, fresh, per constraint (a
bounded LRU); each request gets a copy (about 10 microseconds), at once when it is cached.

Requests with the same constraint share one compile job: the ``n`` choices of one request, and
requests that arrive while it runs. Uncached compiles are bounded (`CompileBudget`): at most
``per_engine`` jobs compiling or queued, at most ``per_client`` of them brought by one client; a
request past either is refused at once (`CompilesBusyError`), never queued. A job that runs
longer than ``timeout_s`` fails the requests waiting for it (`GrammarTimeoutError`); its grammar
is remembered as too slow, so asking again fails at once instead of compiling again. The worker
itself cannot be interrupted: llguidance's fuel limits (`GrammarLimits`) bound how long it stays
busy, and the job counts against the budget until it ends.

The engine thread calls everything here but `_compile`, which runs on the worker.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum

import llguidance

from engine.grammar.limits import CompileBudget, GrammarLimits
from engine.grammar.spec import GrammarError, grammar_text, parser_limits
from engine.tokenizer import TextTokenizer
from sampling.structured_outputs import StructuredOutputs


class CompileLimit(Enum):
    """Which bound of the `CompileBudget` refused a request, by its configuration key."""

    PER_ENGINE = "max_queued_grammar_compiles"
    PER_CLIENT = "max_client_grammar_compiles"


class CompilesBusyError(Exception):
    """Too many uncached grammars compile already (for the engine or for the client): retry later."""

    def __init__(self, limit: CompileLimit, bound: int) -> None:
        whose = "this engine" if limit is CompileLimit.PER_ENGINE else "this client on this engine"
        super().__init__(f"{bound} new grammars are compiling for {whose}, its limit ({limit.value}): retry later")
        self.limit = limit


class GrammarTimeoutError(GrammarError):
    """The grammar compiled for longer than the engine's compile deadline."""


@dataclass
class CompileJob:
    """One uncached constraint compiling (or queued to) on the worker, for every request that waits for it."""

    key: str
    client: str
    future: Future[llguidance.LLMatcher] = field(default_factory=Future)
    started: float | None = None
    """When the worker began it (`time.monotonic`); None while queued."""
    timed_out: bool = False

    def ran_past(self, deadline_s: float, now: float) -> bool:
        return self.started is not None and not self.future.done() and now - self.started > deadline_s


class GrammarCompiler:
    """Compiles for one model's tokenizer; ``vocab_size`` is the model's (its bitmask width), ``cache_size`` grammars are kept."""

    def __init__(self, tokenizer: TextTokenizer, vocab_size: int, cache_size: int, limits: GrammarLimits, budget: CompileBudget) -> None:
        self._text_tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._cache_size = cache_size
        self._limits = limits
        self.budget = budget
        self._cache: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._too_slow: OrderedDict[str, None] = OrderedDict()
        self.jobs: dict[str, CompileJob] = {}
        """Uncached compiles queued or running, by constraint."""
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._token_tags = frozenset(token.content for token in tokenizer.tokenizer.get_added_tokens_decoder().values())
        """The tokenizer's added tokens, special to llguidance (a thinking's tags among them: `grammar_text`)."""
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-compile")

    def matcher(self, constraint: StructuredOutputs, client: str) -> llguidance.LLMatcher | CompileJob:
        """A fresh matcher for ``constraint`` when it compiled before, else the job compiling it
        (shared by every request that asks for it meanwhile). Raises `CompilesBusyError` when a new
        job would pass the budget, `GrammarTimeoutError` when the grammar compiled too slowly before."""
        key = constraint.key
        template = self._cache.get(key)
        if template is not None:
            self._cache.move_to_end(key)
            return template.deep_copy()
        if key in self._too_slow:
            raise self.timeout_error()
        job = self.jobs.get(key)
        if job is None:
            job = self._start(key, constraint, client)
        return job

    def fresh(self, job: CompileJob) -> llguidance.LLMatcher:
        """A matcher of its own for a request whose job is done; raises what the compile raised."""
        return job.future.result().deep_copy()

    def reap(self, now: float) -> None:
        """Cache the jobs that compiled, drop those that ended, mark those that ran past the deadline."""
        for key, job in list(self.jobs.items()):
            if job.ran_past(self.budget.timeout_s, now) and not job.timed_out:
                job.timed_out = True
                self._too_slow[key] = None
                if len(self._too_slow) > self._cache_size:
                    self._too_slow.popitem(last=False)
            if not job.future.done():
                continue
            del self.jobs[key]
            if job.future.exception() is None and not job.timed_out:
                self._cache[key] = job.future.result()
                if len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)

    def _start(self, key: str, constraint: StructuredOutputs, client: str) -> CompileJob:
        self.reap(time.monotonic())  # a job whose requests all failed may have ended while the engine was idle
        if len(self.jobs) >= self.budget.per_engine:
            raise CompilesBusyError(CompileLimit.PER_ENGINE, self.budget.per_engine)
        if sum(job.client == client for job in self.jobs.values()) >= self.budget.per_client:
            raise CompilesBusyError(CompileLimit.PER_CLIENT, self.budget.per_client)
        job = CompileJob(key, client)
        self.jobs[key] = job
        self._worker.submit(self._run, job, constraint)
        return job

    def timeout_error(self) -> GrammarTimeoutError:
        return GrammarTimeoutError(
            f"the grammar did not compile within {self.budget.timeout_s:g} s (grammar_compile_timeout_s): simplify the schema, regex or grammar"
        )

    def _run(self, job: CompileJob, constraint: StructuredOutputs) -> None:
        """On the worker: compile, and settle the job's future."""
        job.started = time.monotonic()
        try:
            job.future.set_result(self._compile(constraint))
        except BaseException as error:
            job.future.set_exception(error)

    def _compile(self, constraint: StructuredOutputs) -> llguidance.LLMatcher:
        grammar = grammar_text(constraint, self._token_tags)
        template = llguidance.LLMatcher(self._llg_tokenizer(), grammar, limits=parser_limits(self._limits))
        template.compute_bitmask()  # builds the lexer now rather than at the request's first step
        if template.is_error():
            raise GrammarError(template.get_error())
        return template

    def _llg_tokenizer(self) -> llguidance.LLTokenizer:
        """Built once, at the first constrained request (about 0.2 s for a 49k vocabulary); only the worker calls it."""
        if self._tokenizer is None:
            tokenizer = self._text_tokenizer
            self._tokenizer = llguidance.LLTokenizer(tokenizer.tokenizer.to_str(), n_vocab=self._vocab_size, eos_token=list(tokenizer.eos_token_ids))
        return self._tokenizer
