"""The data `detok.detokenize_batch` takes and returns: plain immutable tuples."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from detok.state import DetokState
from detok.token_strings import TokenString


class DetokItem(NamedTuple):
    """One request's input: its state, new output ids (any number), whether the engine
    finished it, and ids (sampled and top-N) to render as `TokenString` for logprobs."""

    state: DetokState
    new_token_ids: Sequence[int]
    finished: bool = False
    logprob_token_ids: Sequence[int] = ()


class StopHit(NamedTuple):
    """A stop string ended the request (``stop``), or the answer's ``max_tokens`` did (``stop`` is
    ``None``: `detok.answer`); keep the first ``keep_tokens`` of this call's new ids."""

    stop: str | None
    keep_tokens: int


class DetokResult(NamedTuple):
    """One request's output. With ``error`` set, ``state`` is the input state and text is empty."""

    text: str
    state: DetokState
    stop: StopHit | None = None
    error: str | None = None
    token_strings: tuple[TokenString, ...] = ()
