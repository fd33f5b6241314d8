"""`GrammarLimits`: what compiling and matching one grammar may cost an engine; `CompileBudget`: how
many uncached grammars it compiles at once, and for how long each may compile. Both set by the operator.

llguidance's own limits, set explicitly instead of left at its defaults: its default of 250,000
lexer states at 1-2 kB each lets one grammar's lexer grow to about 500 MB, kept for each of the
cached grammars. A grammar that passes a limit while it compiles is refused; one that passes a
per-step limit while it decodes fails its request alone (`engine.grammar.masks.GrammarStepError`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GrammarLimits:
    max_lexer_states: int = 16_384
    """Lexer states one grammar may build (about 1-2 kB each: at most about 32 MB per grammar); llguidance's default is 250,000."""
    initial_lexer_fuel: int = 1_000_000
    """Work to build a grammar's regular expressions when it compiles (about 50k per ms: 20 ms)."""
    step_lexer_fuel: int = 200_000
    """Lexer work per token's mask (about 14k per ms: 15 ms)."""
    step_max_items: int = 50_000
    """Earley items per token's mask (about 20k per ms: 2.5 ms)."""
    max_items_in_row: int = 2000
    """Earley items in one row of the parse (a row is kept per token for rollback: memory per matcher)."""
    max_grammar_size: int = 500_000
    """Symbols in a grammar's productions."""

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value < 1:
                raise ValueError(f"grammar limit {name} must be at least 1, got {value}")


@dataclass(frozen=True)
class CompileBudget:
    """How many uncached grammars an engine compiles or queues at once, per engine and per client, and for how long each may compile."""

    per_engine: int = 16
    per_client: int = 4
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not 1 <= self.per_client <= self.per_engine:
            raise ValueError(f"need 1 <= max_client_grammar_compiles <= max_queued_grammar_compiles, got {self.per_client} and {self.per_engine}")
        if self.timeout_s <= 0:
            raise ValueError(f"grammar_compile_timeout_s must be positive, got {self.timeout_s}")
