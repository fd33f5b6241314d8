"""A structural tag whose trigger and end are added tokens (Qwen's ``<tool_call>`` and ``</tool_call>``):
llguidance takes every added token for a special token, which text never matches, and the tokenizer
writes the tag as one token, so the grammar must take the tags as tokens (`structural_tag_grammar`)."""

from __future__ import annotations

import llguidance
import tokenizers

from engine.grammar.limits import GrammarLimits
from engine.grammar.spec import grammar_error, grammar_text
from engine.loader.model_files import default_tokenizer
from sampling.structured_outputs import StructuredOutputs

OPEN, CLOSE = "<tool_call>", "</tool_call>"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
CONSTRAINT = StructuredOutputs(
    structural_tag={"type": "structural_tag", "structures": [{"begin": OPEN + "\n", "schema": SCHEMA, "end": "\n" + CLOSE}], "triggers": [OPEN]}
)


def tool_call_tokenizer() -> tokenizers.Tokenizer:
    tokenizer = tokenizers.Tokenizer.from_str(default_tokenizer().tokenizer.to_str())
    tokenizer.add_tokens([tokenizers.AddedToken(tag, special=False, normalized=False) for tag in (OPEN, CLOSE)])
    return tokenizer


TOKENIZER = tool_call_tokenizer()
TAGS = frozenset(token.content for token in TOKENIZER.get_added_tokens_decoder().values())
LLG_TOKENIZER = llguidance.LLTokenizer(TOKENIZER.to_str(), n_vocab=TOKENIZER.get_vocab_size(), eos_token=list(default_tokenizer().eos_token_ids))


def taken(text: str, tags: frozenset[str] = TAGS) -> tuple[int, int, bool]:
    """(tokens of ``text``, how many the grammar takes, whether it may stop after them all)."""
    ids = TOKENIZER.encode(text, add_special_tokens=False).ids
    matcher = llguidance.LLMatcher(LLG_TOKENIZER, grammar_text(CONSTRAINT, tags))
    assert not matcher.is_error(), matcher.get_error()
    count = matcher.validate_tokens(ids)
    return len(ids), count, count == len(ids) and matcher.consume_tokens(ids) and matcher.is_accepting()


def test_the_tags_are_single_tokens():
    assert len(TOKENIZER.encode(OPEN, add_special_tokens=False).ids) == len(TOKENIZER.encode(CLOSE, add_special_tokens=False).ids) == 1


def test_a_call_in_tag_tokens_is_taken_and_its_value_constrained():
    whole = 'Let me look. <tool_call>\n{"name":"x"}\n</tool_call> Done.'
    assert taken(whole)[2]
    assert taken("No call at all.")[2]
    total, count, _ = taken('Call: <tool_call>\n{"other":1}\n</tool_call>')  # the schema wants "name"
    assert count < total


def test_without_the_tags_as_tokens_the_grammar_refuses_the_tag_token():
    """What the grammar did before it knew the tokenizer's tags: text up to the tag token, not the token."""
    total, count, accepted = taken('Hi <tool_call>\n{"name":"x"}\n</tool_call>', frozenset())
    assert count == len(TOKENIZER.encode("Hi ", add_special_tokens=False).ids) < total and not accepted


def test_the_ingress_check_without_a_tokenizer_still_passes():
    assert grammar_error(CONSTRAINT, GrammarLimits()) is None
