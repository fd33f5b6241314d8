"""`TokenizedStrings`: the client strings of one request as token ids, tokenized once.

Bad words, DRY sequence breakers and the negative prompt are text; the engine works on
ids. They are tokenized once per request (not per choice) by its caller, off the engine
thread (the ingress does it on a worker thread), and travel with the request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sampling.params import SamplingParams, TokenIdOutOfVocabError


@dataclass(frozen=True)
class TokenizedStrings:
    bad_words: tuple[tuple[int, ...], ...] = ()
    """The distinct, non-empty id sequences of every bad word, as given and after a space."""
    dry_breakers: tuple[int, ...] = ()
    """The sorted distinct ids of every DRY sequence breaker's tokens (empty when DRY is off)."""
    negative_prompt: tuple[int, ...] = ()
    """The ids of ``negative_prompt`` when guidance is on (empty otherwise)."""

    def check_vocab(self, vocab_size: int) -> None:
        """Raise `TokenIdOutOfVocabError` naming the field if an id is outside ``[0, vocab_size)``."""
        fields = {
            "bad_words": [t for sequence in self.bad_words for t in sequence],
            "dry_sequence_breakers": self.dry_breakers,
            "negative_prompt": self.negative_prompt,
        }
        for name, ids in fields.items():
            bad = next((t for t in ids if not 0 <= t < vocab_size), None)
            if bad is not None:
                raise TokenIdOutOfVocabError(f"{name}: token id {bad} is outside the vocabulary [0, {vocab_size})")


def uses_dry(params: SamplingParams) -> bool:
    return params.dry_multiplier > 0.0 and params.dry_penalty_last_n != 0


def has_strings(params: SamplingParams) -> bool:
    """Whether ``params`` has strings that the engine needs as ids (`tokenize_strings` does the work)."""
    return bool(params.bad_words) or uses_dry(params) or (params.guidance_scale != 1.0 and bool(params.negative_prompt))


def tokenize_strings(params: SamplingParams, encode: Callable[[str], list[int]]) -> TokenizedStrings:
    """The request's strings as ids; ``encode`` is the engine tokenizer's text -> ids."""
    variants = (variant for word in params.bad_words for variant in (word, " " + word))
    bad_words = tuple(sorted({tuple(encode(variant)) for variant in variants} - {()}))
    breakers = tuple(sorted({t for s in params.dry_sequence_breakers for t in encode(s)})) if uses_dry(params) else ()
    negative = tuple(encode(params.negative_prompt)) if params.guidance_scale != 1.0 and params.negative_prompt else ()
    return TokenizedStrings(bad_words, breakers, negative)
