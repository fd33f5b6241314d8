"""A request's `StructuredOutputs` as an llguidance grammar, and the check that it compiles.

`grammar_text` is pure text work; `grammar_error` compiles the grammar without a tokenizer
under the parser limits, so the ingress can refuse a bad schema, regex or grammar (or one
too costly for the limits) before the engine sees it.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict

import llguidance

from engine.grammar.limits import GrammarLimits
from sampling.structured_outputs import StructuredOutputs

ANY_JSON_OBJECT = {"type": "object"}
COMPACT_JSON: dict[str, object] = {"whitespace_flexible": False}
"""JSON without whitespace between tokens (a schema's ``x-guidance`` may allow it): a model cannot spend
its tokens on whitespace, and the output is what ``json.dumps(..., separators=(",", ":"))`` writes."""
GBNF_RULE = re.compile(r"^\s*[A-Za-z][\w-]*\s*::=", re.MULTILINE)


class GrammarError(ValueError):
    """The constraint is not a valid schema, regex or grammar, uses a feature llguidance lacks, or passes its limits."""


def parser_limits(limits: GrammarLimits) -> llguidance.LLParserLimits:
    """llguidance's bounds on a grammar's size, memory and its compile and per-token cost, from
    ``limits``, with errors that do not quote the grammar back."""
    return llguidance.LLParserLimits(**asdict(limits), verbose_errors=False)  # its fields are llguidance's names


def grammar_text(constraint: StructuredOutputs) -> str:
    """The llguidance grammar (its JSON form) of ``constraint``; raises `GrammarError` when it is not even well-formed."""
    matcher = llguidance.LLMatcher
    try:
        if constraint.json_ is not None:
            schema = {} if constraint.json_ is True else constraint.json_  # the schema `true` allows any JSON value, as {} does
            return matcher.grammar_from_json_schema(schema, defaults=COMPACT_JSON)  # type: ignore[arg-type]
        if constraint.json_object:
            return matcher.grammar_from_json_schema(ANY_JSON_OBJECT, defaults=COMPACT_JSON)
        if constraint.regex is not None:
            return matcher.grammar_from_regex(constraint.regex)
        if constraint.choice is not None:
            return matcher.grammar_from_lark("start: " + " | ".join(json.dumps(choice) for choice in constraint.choice))
        assert constraint.grammar is not None
        lark = llguidance.gbnf_to_lark.gbnf_to_lark(constraint.grammar) if GBNF_RULE.search(constraint.grammar) else constraint.grammar
        return matcher.grammar_from_lark(lark)
    except (ValueError, TypeError, AssertionError) as error:
        raise GrammarError(str(error)) from error


def grammar_error(constraint: StructuredOutputs, limits: GrammarLimits) -> str | None:
    """Why ``constraint`` cannot be compiled (None: it can), checked without a tokenizer under ``limits``."""
    try:
        text = grammar_text(constraint)
    except GrammarError as error:
        return str(error)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text, limits=parser_limits(limits))
    return messages[0] if is_error else None
