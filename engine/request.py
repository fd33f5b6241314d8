"""A request as the engine tracks it: its tokens, sampling row, KV blocks and progress through the steps.

Features that keep more per request (beam search, prompt logprobs, grammars still compiling) keep it in their
own modules, keyed by the request: this module imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from engine.kv.sequence_blocks import SequenceBlocks
from engine.ngram_drafter import NgramIndex
from engine.outputs import FinishReason
from sampling.params import SamplingParams
from sampling.tokenized import TokenizedStrings

if TYPE_CHECKING:
    from llguidance import LLMatcher


@dataclass(eq=False)
class Request:
    """One sequence the engine schedules: a client's request, a guidance companion or a beam.

    Compared and hashed by identity: the feature modules key their state by the request object.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    output_token_ids: list[int] = field(default_factory=list)
    strings: TokenizedStrings = field(default_factory=TokenizedStrings)
    """The request's bad words, DRY breakers and negative prompt as ids, tokenized by the caller."""
    slot: int | None = None
    """The request's sampling row, held from admission to finish (through preemption too)."""
    kv: SequenceBlocks = field(default_factory=SequenceBlocks)
    num_computed_tokens: int = 0
    """Tokens whose keys and values are in the cache (or being written by a launched step)."""
    num_placeholders: int = 0
    """Tokens sampled by launched steps whose values have not reached the host yet."""
    finished: bool = False
    draft_token_ids: list[int] = field(default_factory=list)
    """Tokens proposed for the next step, verified after ``output_token_ids`` (and placeholders)."""
    ngram_index: NgramIndex | None = None
    """Set when the request speculates; it has seen the first ``len(ngram_index.tokens)`` tokens."""
    guidance: Guidance | None = None
    grammar: LLMatcher | None = None
    """With ``params.structured_outputs``: the matcher, at the accepted outputs (set once compiled)."""
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    stop_token_ids: frozenset[int] = field(init=False)
    """``params.stop_token_ids`` as a set, built once: checked after every token."""

    def __post_init__(self) -> None:
        self.stop_token_ids = frozenset(self.params.stop_token_ids)

    @property
    def num_tokens(self) -> int:
        """Tokens known on the host: prompt and output."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_total_tokens(self) -> int:
        return self.num_tokens + self.num_placeholders

    @property
    def context_len(self) -> int:
        """Cache positions that the host-known tokens need, in this request's sequence or its companion's."""
        longest_prompt = len(self.prompt_token_ids)
        if self.guidance is not None:
            longest_prompt = max(longest_prompt, len(self.guidance.companion.prompt_token_ids))
        return longest_prompt + len(self.output_token_ids)

    @property
    def sequences(self) -> list[Request]:
        """The request, then its guidance companion if it has one: the sequences that hold a slot and blocks for it."""
        return [self] if self.guidance is None else [self, self.guidance.companion]

    def room_to_grow(self, max_model_len: int) -> int:
        """How many more tokens may still be generated, counting those in flight."""
        room = max_model_len - self.context_len - self.num_placeholders
        if self.params.max_tokens is not None:
            room = min(room, self.params.max_tokens - len(self.output_token_ids) - self.num_placeholders)
        return max(room, 0)

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output, without concatenating the whole sequence."""
        num_prompt = len(self.prompt_token_ids)
        if start >= num_prompt:
            return self.output_token_ids[start - num_prompt : end - num_prompt]
        return self.prompt_token_ids[start:end] + self.output_token_ids[: max(end - num_prompt, 0)]


@dataclass
class Guidance:
    """Classifier-free guidance: the sampler gets ``l_u + scale * (l_c - l_u)``.

    companion: the unconditional sequence, negative prompt then the parent's outputs (the
    same list object); it has its own slot and block table and is scheduled in the parent's steps.
    """

    scale: float
    companion: Request


class Stop(NamedTuple):
    """Why a request ends: the output's finish reason, and the stop token id that ended it (None for EOS or a length)."""

    reason: FinishReason
    stop_token: int | None = None


def check_stop(request: Request, eos_token_ids: tuple[int, ...], max_model_len: int) -> Stop | None:
    """Whether the token just appended ends the request, and why."""
    params = request.params
    num_output = len(request.output_token_ids)
    last = request.output_token_ids[-1]
    if num_output >= params.min_tokens:
        if not params.ignore_eos and last in eos_token_ids:
            return Stop(FinishReason.STOP)
        if last in request.stop_token_ids:
            return Stop(FinishReason.STOP, last)
    if params.max_tokens is not None and num_output >= params.max_tokens:
        return Stop(FinishReason.LENGTH)
    if request.context_len >= max_model_len:
        return Stop(FinishReason.LENGTH)
    return None
