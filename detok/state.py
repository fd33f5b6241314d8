"""Per-request detokenizer state: small, immutable plain data that pickles cheaply.

The serving layer keeps one `DetokState` per request and passes it, with new token
ids, to `detok.detokenize_batch`, which returns the next state. Nothing here holds a
tokenizer, and the size is bounded whatever the output length: a few context ids, the
ids whose text is not final yet, and at most ``max(len(stop)) - 1`` held chars.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from tokenizers import Tokenizer

from sampling.params import SamplingParams

CONTEXT_TOKENS = 4
"""Most prompt ids kept as context, so the first output id decodes with its leading space."""

REPLACEMENT = "\ufffd"


class DetokParams(NamedTuple):
    """The request's fixed detokenization settings (from `SamplingParams`)."""

    skip_special_tokens: bool
    stop: tuple[str, ...]
    holdback: int
    """Chars withheld while streaming: ``max(len(s) for s in stop) - 1``, or 0."""
    min_tokens: int
    include_stop_str_in_output: bool


class DetokState(NamedTuple):
    """Where one request's incremental detokenization stands (a tuple: immutable, cheap to pickle).

    ``window`` is ``ctx_len`` context ids, whose text is accounted for and is ``ctx_chars``
    long (``None``: not known, decode it), followed by pending ids whose text may still
    change; ``pending_sent`` chars of the pending text were already passed on. ``held`` is
    text withheld, at most ``params.holdback`` chars, so a stop string can match across calls.
    """

    window: tuple[int, ...]
    ctx_len: int
    ctx_chars: int | None
    pending_sent: int
    held: str
    num_output_tokens: int
    done: bool
    params: DetokParams


def initial_state(tokenizer: Tokenizer, prompt_token_ids: Sequence[int], params: SamplingParams) -> DetokState:
    """State for a request whose prompt is ``prompt_token_ids``, before any output.

    The last prompt ids become decoding context, never output. If their text ends in
    U+FFFD (the prompt ends inside a character or on invalid bytes) the context is
    dropped so output bytes cannot merge with prompt bytes. One tokenizer call; raises
    ``OverflowError`` for a negative prompt id.
    """
    context = tuple(prompt_token_ids[-CONTEXT_TOKENS:])
    text = tokenizer.decode(list(context), skip_special_tokens=params.skip_special_tokens) if context else ""
    if text.endswith(REPLACEMENT):
        context, text = (), ""
    stop = tuple(params.stop)
    fixed = DetokParams(
        skip_special_tokens=params.skip_special_tokens,
        stop=stop,
        holdback=max(map(len, stop), default=1) - 1,
        min_tokens=params.min_tokens,
        include_stop_str_in_output=params.include_stop_str_in_output,
    )
    return DetokState(context, len(context), len(text), 0, "", 0, False, fixed)
