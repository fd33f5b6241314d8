"""Per-request detokenizer state: small, immutable plain data that pickles cheaply.

The serving layer keeps one `DetokState` per request and passes it, with new token
ids, to `detok.detokenize_batch`, which returns the next state. Nothing here holds a
tokenizer, and the size is bounded whatever the output length: a few context ids, the
ids whose text is not final yet, and at most ``max(len(stop)) - 1`` chars of stop-matching tail.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from tokenizers import Tokenizer

from detok.pieces import REPLACEMENT, pieces_of
from detok.thinking import AnswerProgress, AnswerRules, initial_progress
from sampling.params import SamplingParams

CONTEXT_TOKENS = 4
"""Most prompt ids kept as context, so the first output id decodes with its leading space."""


class DetokParams(NamedTuple):
    """The request's fixed detokenization settings (from `SamplingParams`)."""

    skip_special_tokens: bool
    stop: tuple[str, ...]
    stop_tail_len: int
    """Chars of text kept for matching stop strings across calls: ``max(len(s) for s in stop) - 1``, or 0."""
    min_tokens: int
    include_stop_str_in_output: bool
    answer: AnswerRules | None = None
    """With a reasoning parser: where the answer begins and its token limit (`detok.answer`)."""


class DetokState(NamedTuple):
    """Where one request's incremental detokenization stands (a tuple: immutable, cheap to pickle).

    ``window`` is ``ctx_len`` context ids, whose text is accounted for and is ``ctx_chars``
    long (``None``: not known, decode it), followed by pending ids whose text may still
    change; ``pending_sent`` chars of the pending text were already passed on. ``stop_tail``
    is the last ``params.stop_tail_len`` chars of text so far, so a stop string can match across
    calls: withheld from output, unless ``include_stop_str_in_output`` (the stop is sent with the
    text anyway, so nothing needs holding back) when it was already sent.
    """

    window: tuple[int, ...]
    ctx_len: int
    ctx_chars: int | None
    pending_sent: int
    stop_tail: str
    num_output_tokens: int
    done: bool
    params: DetokParams
    answer: AnswerProgress | None = None
    """With ``params.answer``: where the output stands, thinking or answer."""


def initial_state(tokenizer: Tokenizer, prompt_token_ids: Sequence[int], params: SamplingParams, answer: AnswerRules | None = None) -> DetokState:
    """State for a request whose prompt is ``prompt_token_ids``, before any output; with ``answer``, stop
    strings and ``answer.max_tokens`` apply to the answer after a thinking (`detok.answer`).

    Byte-level BPE: the last prompt ids become decoding context, never output. If their
    text ends in U+FFFD (the prompt ends inside a character or on invalid bytes) the context
    is dropped so output bytes cannot merge with prompt bytes. One tokenizer call; raises
    ``OverflowError`` for a negative prompt id. Other decoders: the context is the
    tokenizer's anchor token (`detok.pieces`) if the prompt renders any text, so the first
    output token keeps its leading space; no tokenizer call after the first for a tokenizer.
    """
    pieces = pieces_of(tokenizer)
    skip = params.skip_special_tokens
    if pieces is not None:
        context = pieces.anchor if pieces.renders_text(prompt_token_ids, skip) else ()
        ctx_chars = pieces.anchor_chars if context else 0
    else:
        context = tuple(prompt_token_ids[-CONTEXT_TOKENS:])
        text = tokenizer.decode(list(context), skip_special_tokens=skip) if context else ""
        if text.endswith(REPLACEMENT):
            context, text = (), ""
        ctx_chars = len(text)
    progress = None if answer is None else initial_progress(answer.tags)
    return DetokState(context, len(context), ctx_chars, 0, "", 0, False, _fixed_params(params, answer), progress)


def _fixed_params(params: SamplingParams, answer: AnswerRules | None) -> DetokParams:
    stop = tuple(params.stop)
    return DetokParams(
        skip_special_tokens=params.skip_special_tokens,
        stop=stop,
        stop_tail_len=max(map(len, stop), default=1) - 1,
        min_tokens=params.min_tokens,
        include_stop_str_in_output=params.include_stop_str_in_output,
        answer=answer,
    )
