"""A constraint after a thinking whose tags are tokens: llguidance takes every added token for a special
token, which text never matches, so ``<think>`` and ``</think>`` added as Qwen3's and DeepSeek-R1's
tokenizers add them (ordinary tokens to the tokenizer) must be allowed as tokens (`after_free_text`)."""

from __future__ import annotations

import llguidance
import pytest

from engine.grammar.limits import GrammarLimits
from engine.grammar.spec import grammar_error, grammar_text
from sampling.structured_outputs import StructuredOutputs
from tests.thinking_model import thinking_tokenizer

TOKENIZER = thinking_tokenizer()
TAGS = frozenset(token.content for token in TOKENIZER.tokenizer.get_added_tokens_decoder().values())
LLG_TOKENIZER = llguidance.LLTokenizer(TOKENIZER.tokenizer.to_str(), n_vocab=TOKENIZER.vocab_size, eos_token=list(TOKENIZER.eos_token_ids))
CONSTRAINT = StructuredOutputs(choice=["yes", "no"], reasoning_end="</think>")


def taken(ids: list[int], tags: frozenset[str] = TAGS) -> tuple[int, bool]:
    """How many of ``ids`` the grammar takes, and whether it may stop after them all."""
    matcher = llguidance.LLMatcher(LLG_TOKENIZER, grammar_text(CONSTRAINT, tags))
    assert not matcher.is_error(), matcher.get_error()
    count = matcher.validate_tokens(ids)
    return count, count == len(ids) and matcher.consume_tokens(ids) and matcher.is_accepting()


def ids(text: str) -> list[int]:
    return TOKENIZER.encode(text, add_special_tokens=False)


def test_the_tags_are_tokens_of_this_tokenizer():
    assert ids("<think>a</think>")[0] == TOKENIZER.tokenizer.token_to_id("<think>") and len(ids("</think>")) == 1


@pytest.mark.parametrize("thinking", ["<think>The user asks</think>", "The user asks</think>", "<think></think>", "<think>x\n\ny</think>"])
def test_a_thinking_in_tag_tokens_is_free_and_the_answer_constrained(thinking):
    assert taken(ids(thinking + "yes")) == (len(ids(thinking + "yes")), True)
    assert taken(ids(thinking + "maybe"))[0] == len(ids(thinking))  # the answer's first token is refused
    assert taken(ids(thinking + "</think>"))[0] == len(ids(thinking))  # the thinking is over


def test_without_the_tags_as_tokens_the_grammar_refuses_the_thinking():
    """What the grammar did before it knew the tokenizer's tags: the model's ``<think>`` token is refused."""
    assert taken(ids("<think>a</think>yes"), frozenset()) == (0, False)


def test_the_ingress_check_without_a_tokenizer_still_passes():
    assert grammar_error(CONSTRAINT, GrammarLimits()) is None
