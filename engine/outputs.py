"""What the engine reports about a request: its new tokens, logprobs and why it finished.

A leaf: every other module of the engine, and its callers, import these values; they import nothing of the engine.
A token's logprobs (`TokenLogprobs`, `PromptLogprobs`) are `sampling.token_logprobs`' values, which the wire format
reads without importing the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from sampling.token_logprobs import PromptLogprobs, TokenLogprobs


class FinishReason(str, Enum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"
    """The request failed inside the engine (`EngineOutput.error` says why); the others went on."""
    GRAMMAR_DEAD_END = "grammar_dead_end"
    """Its structured-output grammar left no token to emit (or its other masks banned every one the grammar allows)."""


@dataclass(frozen=True)
class Hypothesis:
    """A beam: its generated tokens, their summed logprob, and why it ended (None: live)."""

    token_ids: tuple[int, ...]
    cumulative_logprob: float
    logprobs: tuple[TokenLogprobs, ...] = ()
    """One entry per token when the request asked for logprobs."""
    finish_reason: FinishReason | None = None
    stop_reason: int | None = None


@dataclass(frozen=True)
class RequestError:
    """Why one request failed in the engine.

    client_fault: the request's own data could not be run (an HTTP 400); otherwise the
    engine failed on it (a 500).
    """

    message: str
    client_fault: bool


@dataclass
class EngineOutput:
    """New tokens of one request from one step; ``finish_reason`` set on its last output.

    stop_reason: the stop token id that ended it, None for EOS or when not stopped by a token.
    """

    request_id: str
    new_token_ids: list[int]
    num_prompt_tokens: int
    finish_reason: FinishReason | None = None
    stop_reason: int | None = None
    logprobs: list[TokenLogprobs] | None = None
    """One entry per new token when the request asked for logprobs."""
    prompt_logprobs: PromptLogprobs | None = None
    """On the request's first output, when it asked for prompt logprobs."""
    num_draft_tokens: int = 0
    """Tokens drafted for the request in the step(s) of this output."""
    num_accepted_tokens: int = 0
    """Of those, the ones the target model accepted (``new_token_ids`` may drop some after a stop)."""
    error: RequestError | None = None
    """Set with ``finish_reason`` ERROR."""
    beams: list[Hypothesis] | None = None
    """A beam search's final output: its ``n`` best beams, best first (`engine.beam.choices.beam_choice_outputs`)."""
