"""`TokenizedStrings`: the client strings of one request as token ids, tokenized once.

Bad words, DRY sequence breakers and the negative prompt are text; the engine works on
ids. They are tokenized once per request (not per choice) by its caller, off the engine
thread (the ingress does it on a worker thread), and travel with the request.

Bad words and breakers are text the model emits, so they are encoded without the special
tokens a post-processor adds (a BOS in front would make a bad word never match); the
negative prompt replaces the prompt of guidance's unconditional sequence, so it is
encoded as a prompt is, with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sampling.params import SamplingParams, TokenIdOutOfVocabError

ANCHOR = "a"
"""Text put before a bad word's spaced variant and cut off again, so the variant is encoded as it follows other text."""


class Encode(Protocol):
    """The engine tokenizer's text -> ids (`engine.tokenizer.TextTokenizer.encode`); ``add_special_tokens``
    runs its post-processor (BOS where the model wants one)."""

    def __call__(self, text: str, add_special_tokens: bool) -> list[int]: ...


@dataclass(frozen=True)
class TokenizedStrings:
    bad_words: tuple[tuple[int, ...], ...] = ()
    """The distinct, non-empty id sequences of every bad word, as given and after other text and a space."""
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


def tokenize_strings(params: SamplingParams, encode: Encode) -> TokenizedStrings:
    """The request's strings as ids (bad words and breakers without special tokens, the negative prompt with them)."""
    bad_words = _bad_word_sequences(params.bad_words, encode)
    breakers = ()
    if uses_dry(params):
        breakers = tuple(sorted({t for s in params.dry_sequence_breakers for t in encode(s, add_special_tokens=False)}))
    negative = ()
    if params.guidance_scale != 1.0 and params.negative_prompt:
        negative = tuple(encode(params.negative_prompt, add_special_tokens=True))
    return TokenizedStrings(bad_words, breakers, negative)


def _bad_word_sequences(words: list[str], encode: Encode) -> tuple[tuple[int, ...], ...]:
    """Each word's ids as given and as the model emits it after other text and a space; distinct, non-empty, sorted."""
    if not words:
        return ()
    anchor = encode(ANCHOR, add_special_tokens=False)
    sequences = {tuple(encode(word, add_special_tokens=False)) for word in words}
    sequences |= {_after_text(word, anchor, encode) for word in words}
    return tuple(sorted(sequences - {()}))


def _after_text(word: str, anchor: list[int], encode: Encode) -> tuple[int, ...]:
    """The ids of " " + ``word`` where it follows other text: encoded after `ANCHOR`, whose ids (``anchor``) are cut off.

    Alone, " word" is not always what the model emits mid-text: a Metaspace tokenizer that
    prepends "▁" to its input (Llama-2's) encodes it as "▁" "▁word", where after other text
    the model writes "▁word". Where the anchor merges with what follows, " word" alone.
    """
    joined = encode(ANCHOR + " " + word, add_special_tokens=False)
    if joined[: len(anchor)] == anchor:
        return tuple(joined[len(anchor) :])
    return tuple(encode(" " + word, add_special_tokens=False))
