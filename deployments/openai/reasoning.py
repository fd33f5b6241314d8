"""Reasoning parsers: a choice's text split into its reasoning and its answer, as it streams.

The ``<think>…</think>`` family (vLLM's parsers of these names):

- ``deepseek_r1``: the chat template opens the thinking (DeepSeek-R1's writes ``<think>\\n`` at the
  end of the prompt), so the output starts in reasoning; a ``<think>`` the model writes first is
  dropped; everything up to ``</think>`` is reasoning, everything after it the answer;
- ``qwen3``: the output is reasoning only when it starts with ``<think>`` (Qwen3 with thinking on);
  otherwise (thinking off: its template writes an empty ``<think></think>`` in the prompt) it is
  all answer.

The tags never reach either side. A request's output constraint applies to the answer: the grammar
lets the thinking run free up to ``</think>`` (`constrained_after_thinking`); so do its stop strings and
``max_tokens``, which the detokenizer applies with the same rules (`ReasoningParser.tags`, `answer_budget`). The split is made on the text the detokenizer gives, holding back
only what could still be the start of a tag, so whatever the split of the text into deltas, the
reasoning and the answer are the same (`tests/deployments/openai/test_reasoning.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from detok import AnswerRules, ThinkingTags
from sampling.params import SamplingParams
from sampling.structured_outputs import StructuredOutputs

THINK_START, THINK_END = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningParser:
    name: str
    starts_in_reasoning: bool

    @property
    def tags(self) -> ThinkingTags:
        """The same rules, for the detokenizer, which applies stop strings and ``max_tokens`` to the answer."""
        return ThinkingTags(THINK_START, THINK_END, self.starts_in_reasoning)


REASONING_PARSERS = {"deepseek_r1": ReasoningParser("deepseek_r1", True), "qwen3": ReasoningParser("qwen3", False)}


def _held(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` could start ``tag``."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


class ReasoningSplitter:
    """One choice's text deltas as (reasoning, answer) deltas."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.parser = parser
        self.state = "opening"  # then "reasoning" or "answer"
        self.pending = ""

    def feed(self, text: str, finished: bool = False) -> tuple[str, str]:
        self.pending += text
        reasoning = answer = ""
        if self.state == "opening":
            if THINK_START.startswith(self.pending) and not finished:
                return "", ""  # could still be the opening tag
            opened = self.pending.startswith(THINK_START)
            if opened:
                self.pending = self.pending[len(THINK_START) :]
            self.state = "reasoning" if opened or self.parser.starts_in_reasoning else "answer"
        if self.state == "reasoning":
            end = self.pending.find(THINK_END)
            if end >= 0:
                reasoning, self.pending = self.pending[:end], self.pending[end + len(THINK_END) :]
                self.state = "answer"
            else:
                keep = 0 if finished else _held(self.pending, THINK_END)
                reasoning, self.pending = self.pending[: len(self.pending) - keep], self.pending[len(self.pending) - keep :]
        if self.state == "answer":
            answer, self.pending = self.pending, ""
        return reasoning, answer


def thinking_closed(prompt_tail: str) -> bool:
    """Whether the prompt's last characters close a thinking (Qwen3's template with thinking off writes
    an empty ``<think></think>``): then the output is all answer, and a constraint applies from its start."""
    return THINK_END in prompt_tail


def constrained_after_thinking(params: SamplingParams, prompt_tail: str) -> SamplingParams:
    """With a reasoning parser: the request's output constraint (structured outputs, a forced tool call)
    applies after the thinking the output starts with, unless the prompt closed the thinking."""
    constraint = params.structured_outputs
    if constraint is None or thinking_closed(prompt_tail):
        return params
    after = StructuredOutputs(**constraint.model_dump(by_alias=True, exclude_defaults=True), reasoning_end=THINK_END)  # anew: its key is cached
    return params.model_copy(update={"structured_outputs": after})


def answer_budget(params: SamplingParams, parser: ReasoningParser, max_thinking_tokens: int | None) -> tuple[SamplingParams, AnswerRules]:
    """``max_tokens`` counts the answer: the detokenizer ends the output ``max_tokens`` ids after the thinking
    (`detok.answer`, aborting it in the engine as a stop string does), and the engine's own limit becomes
    ``max_tokens + max_thinking_tokens`` (``None``: the context's room alone bounds the thinking). A beam
    search's ``max_tokens`` still counts the whole output (its beams are scored whole)."""
    limit = params.max_tokens
    if not limit or params.use_beam_search:  # None: until the context is full; 0: the prompt only scored; a beam search's length counts all
        return params, AnswerRules(parser.tags, None)
    engine_limit = None if max_thinking_tokens is None else limit + max_thinking_tokens
    return params.model_copy(update={"max_tokens": engine_limit}), AnswerRules(parser.tags, limit)
