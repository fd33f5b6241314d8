"""Per-request detokenizer state: small, immutable plain data that pickles cheaply.

The serving layer keeps one `DetokState` per request and passes it, with new token
ids, to `detok.detokenize_batch`, which returns the next state. Nothing here holds a
tokenizer, and the size is bounded whatever the output length: a few context ids, the
ids whose text is not complete yet, and at most ``max(len(stop)) - 1`` held chars.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

from sampling.params import SamplingParams

CONTEXT_TOKENS = 4
"""Ids kept before the undecided ones so that window decodes render leading spaces right."""

REPLACEMENT = "\ufffd"


@dataclass(frozen=True, slots=True)
class DetokState:
    """Where one request's incremental detokenization stands.

    ``window`` is ``ctx_len`` context ids (text fully accounted for) followed by the
    pending ids whose text may still change; ``pending_sent`` chars of the pending
    ids' text were already passed on. ``held`` is text withheld for stop matching.
    """

    window: tuple[int, ...]
    ctx_len: int
    pending_sent: int
    held: str
    num_output_tokens: int
    stop: tuple[str, ...]
    min_tokens: int
    skip_special_tokens: bool
    include_stop_str_in_output: bool
    done: bool = False

    @property
    def holdback(self) -> int:
        """Chars to withhold while streaming so a stop string can match across calls."""
        return max(map(len, self.stop), default=1) - 1


def initial_state(tokenizer: Tokenizer, prompt_token_ids: Sequence[int], params: SamplingParams) -> DetokState:
    """State for a request whose prompt is ``prompt_token_ids``, before any output.

    The last prompt ids become decoding context, never output. If their text ends in
    U+FFFD (the prompt ends inside a character or on invalid bytes) the context is
    dropped so output bytes cannot merge with prompt bytes. Raises ``OverflowError`` for
    a negative prompt id (one tokenizer call).
    """
    context = tuple(prompt_token_ids[-CONTEXT_TOKENS:])
    if context and tokenizer.decode(list(context), skip_special_tokens=params.skip_special_tokens).endswith(
        REPLACEMENT
    ):
        context = ()
    return DetokState(
        window=context,
        ctx_len=len(context),
        pending_sent=0,
        held="",
        num_output_tokens=0,
        stop=tuple(params.stop),
        min_tokens=params.min_tokens,
        skip_special_tokens=params.skip_special_tokens,
        include_stop_str_in_output=params.include_stop_str_in_output,
    )
