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
from sampling.structured_outputs import StructuralTag, StructuredOutputs

ANY_JSON_OBJECT = {"type": "object"}
COMPACT_JSON: dict[str, object] = {"whitespace_flexible": False}
"""JSON without whitespace between tokens (a schema's ``x-guidance`` may allow it): a model cannot spend
its tokens on whitespace, and the output is what ``json.dumps(..., separators=(",", ":"))`` writes."""
GBNF_RULE = re.compile(r"^\s*[A-Za-z][\w-]*\s*::=", re.MULTILINE)
TOKEN_TAG = re.compile(r"<[^<>\s]+>")
"""An added token a Lark rule can name as a token (``<tool_call>``, ``</think>``, ``<|im_end|>``)."""


class GrammarError(ValueError):
    """The constraint is not a valid schema, regex or grammar, uses a feature llguidance lacks, or passes its limits."""


def parser_limits(limits: GrammarLimits) -> llguidance.LLParserLimits:
    """llguidance's bounds on a grammar's size, memory and its compile and per-token cost, from
    ``limits``, with errors that do not quote the grammar back."""
    return llguidance.LLParserLimits(**asdict(limits), verbose_errors=False)  # its fields are llguidance's names


def grammar_text(constraint: StructuredOutputs, token_tags: frozenset[str] = frozenset()) -> str:
    """The llguidance grammar (its JSON form) of ``constraint``, free text until its ``reasoning_end``
    when it has one (`after_free_text`; ``token_tags``: the tokenizer's added tokens, which llguidance
    takes for special tokens); raises `GrammarError` when it is not even well-formed."""
    text = _answer_grammar(constraint, token_tags)
    return text if constraint.reasoning_end is None else after_free_text(text, constraint.reasoning_end, token_tags)


def opening_tag(end: str) -> str:
    """The tag a thinking that ``end`` closes opens with: ``<think>`` for ``</think>``."""
    return "<" + end[2:] if end.startswith("</") else end


def after_free_text(answer: str, end: str, token_tags: frozenset[str] = frozenset()) -> str:
    """Free text up to and with ``end`` (a lazy match: the first ``end`` closes it), then ``answer``: a
    reasoning model thinks freely and its answer is constrained (llguidance's nested grammars).

    llguidance takes every added token of a tokenizer (``token_tags``) for a special token, which text
    never matches, even one the tokenizer does not call special, as Qwen3's and DeepSeek-R1's ``<think>``
    and ``</think>`` are: where ``end`` is one, the thinking may also end with that token (after free text
    without ``end`` in it), and where its opening tag is one, the thinking may start with that token."""
    top = json.loads(answer) if answer.lstrip().startswith("{") else {"grammars": [{"lark_grammar": answer}]}  # its JSON form, or Lark
    top["grammars"][0]["name"] = "constrained_answer"
    opening, end_is_token = opening_tag(end), lark_token(end, token_tags)
    rules = [
        f"start: {opening + '?' if lark_token(opening, token_tags) else ''} thinking @constrained_answer",
        f"thinking: text_thinking{' | FREE_TEXT_WITHOUT_END ' + end if end_is_token else ''}",
        f"text_thinking[lazy]: FREE_TEXT {json.dumps(end)}",
        "FREE_TEXT: /(.|\\n)*/",
    ]
    if end_is_token:
        escaped = re.escape(end).replace("/", "\\/")
        rules.append(f"FREE_TEXT_WITHOUT_END: /(.|\\n)*/ & ~/(.|\\n)*{escaped}(.|\\n)*/")
    top["grammars"].insert(0, {"lark_grammar": "\n".join(rules)})
    return json.dumps(top)


def _answer_grammar(constraint: StructuredOutputs, token_tags: frozenset[str]) -> str:
    matcher = llguidance.LLMatcher
    try:
        if constraint.json_ is not None:
            return matcher.grammar_from_json_schema(json_schema(constraint, constraint.json_), defaults=json_defaults(constraint))
        if constraint.json_object:
            return matcher.grammar_from_json_schema(ANY_JSON_OBJECT, defaults=json_defaults(constraint))
        if constraint.structural_tag is not None:
            return structural_tag_grammar(constraint, constraint.structural_tag, token_tags)
        if constraint.regex is not None:
            return matcher.grammar_from_regex(constraint.regex)
        if constraint.choice is not None:
            return matcher.grammar_from_lark("start: " + " | ".join(json.dumps(choice) for choice in constraint.choice))
        assert constraint.grammar is not None
        lark = llguidance.gbnf_to_lark.gbnf_to_lark(constraint.grammar) if GBNF_RULE.search(constraint.grammar) else constraint.grammar
        return matcher.grammar_from_lark(lark)
    except (ValueError, TypeError, AssertionError) as error:
        raise GrammarError(str(error)) from error


def json_defaults(constraint: StructuredOutputs) -> dict[str, object]:
    """llguidance's JSON options for the constraint: compact unless ``disable_any_whitespace`` is false
    (vLLM's default: any whitespace) or a ``whitespace_pattern`` says what whitespace may go between tokens."""
    if constraint.whitespace_pattern is not None:
        return {"whitespace_flexible": True, "whitespace_pattern": constraint.whitespace_pattern}
    return {"whitespace_flexible": True} if constraint.disable_any_whitespace is False else COMPACT_JSON


def json_schema(constraint: StructuredOutputs, schema: dict | bool) -> dict:
    """The schema as llguidance takes it: `true` as {} (both allow any JSON value); with
    ``disable_additional_properties``, closed objects (`closed_objects`)."""
    as_object = {} if schema is True else schema
    assert isinstance(as_object, dict), "the schema false allows nothing"
    return closed_objects(as_object) if constraint.disable_additional_properties else as_object


def closed_objects(schema: object) -> dict:
    """A copy of ``schema`` in which every schema with ``properties`` (or ``patternProperties``) that does
    not say whether it takes others says it does not (``"additionalProperties": false``), at any depth."""

    def close(node: object) -> object:
        if isinstance(node, list):
            return [close(item) for item in node]
        if not isinstance(node, dict):
            return node
        closed = {key: close(value) for key, value in node.items()}
        has_properties = isinstance(node.get("properties"), dict) or isinstance(node.get("patternProperties"), dict)
        if has_properties and "additionalProperties" not in node:
            closed["additionalProperties"] = False
        return closed

    closed = close(schema)
    assert isinstance(closed, dict)
    return closed


def structural_tag_grammar(constraint: StructuredOutputs, tag: StructuralTag, token_tags: frozenset[str] = frozenset()) -> str:
    """Free text in which each structure's trigger starts ``begin``, a JSON value of its schema, ``end``
    (the Lark that llguidance's `llguidance.StructTag.to_grammar` writes: lazy triggers); the JSON options
    apply to each value. Each schema goes in as a schema: a grammar's JSON form there would be read as a
    schema of unknown keywords (anything goes), which is how vLLM's guidance backend passes it.

    Triggers, ``begin`` and ``end`` are text, except where they hold one of the tokenizer's added tokens
    (``token_tags``, as Qwen's ``<tool_call>``; `lark_literal`): llguidance takes those for special tokens,
    which text never matches, and a tokenizer writes them as one token. `StructTag.to_grammar` cannot
    mix the two (its ``assume_special`` takes every trigger written ``<...>`` for a token, or none)."""
    rules = [
        "%llguidance {}",
        f"start: ({' | '.join(f'tag_{i}' for i in range(len(tag.structures)))})* TAG_TEXT",
        "TAG_TEXT: /(.|\\n)*/",
    ]
    for i, structure in enumerate(tag.structures):
        trigger = tag.trigger_of(structure) or ""
        schema = json_schema(constraint, structure.schema_) | {"x-guidance": json_defaults(constraint)}
        body = f"{lark_literal(structure.begin[len(trigger) :], token_tags)} %json {json.dumps(schema)} {lark_literal(structure.end, token_tags)}"
        if lark_token(trigger, token_tags):
            rules.append(f"tag_{i}: TAG_TEXT {trigger} {body}")
        else:
            rules += [f"tag_{i}_trigger[lazy]: TAG_TEXT {json.dumps(trigger)}", f"tag_{i}: tag_{i}_trigger {body}"]
    return "\n".join(rules)


def lark_token(text: str, token_tags: frozenset[str]) -> bool:
    """Whether ``text`` is an added token that Lark can name as one: ``<...>`` without spaces."""
    return text in token_tags and TOKEN_TAG.fullmatch(text) is not None


def lark_literal(text: str, token_tags: frozenset[str]) -> str:
    """``text`` as a sequence in a Lark rule: the added tokens in it (`lark_token`) as tokens, the rest
    quoted; empty for empty text."""
    tags = sorted((t for t in token_tags if lark_token(t, token_tags) and t in text), key=len, reverse=True)
    if not tags:
        return json.dumps(text) if text else ""
    pieces = re.split("(" + "|".join(re.escape(t) for t in tags) + ")", text)
    return " ".join(piece if piece in tags else json.dumps(piece) for piece in pieces if piece)


def grammar_error(constraint: StructuredOutputs, limits: GrammarLimits) -> str | None:
    """Why ``constraint`` cannot be compiled (None: it can), checked without a tokenizer under ``limits``."""
    try:
        text = grammar_text(constraint)
    except GrammarError as error:
        return str(error)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text, limits=parser_limits(limits))
    return messages[0] if is_error else None
