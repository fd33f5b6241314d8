"""`GrammarCompiler`: structured-output constraints compiled on a worker thread, cached by grammar.

llguidance compiles when a matcher is made (it drops the GIL meanwhile) and builds its lexer
at the first mask; both happen on the worker, so a slow grammar delays only the request that
brought it, never the engine's step loop. A compiled matcher is kept, fresh, per grammar
text (a bounded LRU); each request gets a copy (about 10 microseconds).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import llguidance

from engine.grammar.spec import GrammarError, grammar_text, parser_limits
from engine.tokenizer import TextTokenizer
from sampling.structured_outputs import StructuredOutputs


class GrammarCompiler:
    """Compiles for one model's tokenizer; ``vocab_size`` is the model's (its bitmask width), ``cache_size`` grammars are kept."""

    def __init__(self, tokenizer: TextTokenizer, vocab_size: int, cache_size: int) -> None:
        self._text_tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._cache_size = cache_size
        self._cache: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-compile")

    def submit(self, constraint: StructuredOutputs) -> Future[llguidance.LLMatcher]:
        """A fresh matcher for ``constraint``, compiled on the worker; the future raises `GrammarError`."""
        return self._worker.submit(self.compile, constraint)

    def compile(self, constraint: StructuredOutputs) -> llguidance.LLMatcher:
        """A fresh matcher for ``constraint`` (from the cache when its grammar was compiled before)."""
        text = grammar_text(constraint)
        with self._lock:
            template = self._cache.get(text)
            if template is not None:
                self._cache.move_to_end(text)
                return template.deep_copy()
        template = llguidance.LLMatcher(self._llg_tokenizer(), text, limits=parser_limits())
        template.compute_bitmask()  # builds the lexer now rather than at the request's first step
        if template.is_error():
            raise GrammarError(template.get_error())
        with self._lock:
            self._cache[text] = template
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return template.deep_copy()

    def _llg_tokenizer(self) -> llguidance.LLTokenizer:
        """Built once, at the first constrained request (about 0.2 s for a 49k vocabulary); only the worker calls it."""
        if self._tokenizer is None:
            tokenizer = self._text_tokenizer
            self._tokenizer = llguidance.LLTokenizer(tokenizer.tokenizer.to_str(), n_vocab=self._vocab_size, eos_token=list(tokenizer.eos_token_ids))
        return self._tokenizer
