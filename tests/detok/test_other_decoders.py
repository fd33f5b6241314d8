"""A llama-style tokenizer (byte fallback, metaspace): the generic path, as vLLM behaves."""

from __future__ import annotations

import pytest
from streaming import stream
from tokenizers import Tokenizer, decoders, models

from detok import initial_state
from sampling.params import SamplingParams

WORDS = ["▁Hello", "▁world", "▁again", "!"]


@pytest.fixture(scope="module")
def llama_like() -> Tokenizer:
    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}}
    vocab.update({w: 257 + n for n, w in enumerate(WORDS)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return tok


def ids_of(*pieces: str | bytes) -> list[int]:
    """Ids of vocab words (str) and of byte-fallback tokens for raw bytes."""
    return [i for p in pieces for i in ([257 + WORDS.index(p)] if isinstance(p, str) else [1 + b for b in p])]


def test_byte_fallback_characters_are_never_sent_half_done(llama_like: Tokenizer) -> None:
    ids = ids_of("▁Hello", "▁world", "😀".encode(), "!", "中".encode(), "▁again")
    result = stream(llama_like, initial_state(llama_like, [], SamplingParams()), [[i] for i in ids])
    assert result.text == llama_like.decode(ids) == "Hello world😀!中 again"
    assert all("\ufffd" not in d for d in result.deltas)


def test_prompt_context_keeps_the_leading_space(llama_like: Tokenizer) -> None:
    """Metaspace strips the first space of a decode; after a prompt the space is real text."""
    prompt, ids = ids_of("▁Hello"), ids_of("▁world", "▁again")
    result = stream(llama_like, initial_state(llama_like, prompt, SamplingParams()), [[i] for i in ids])
    assert result.deltas[0] == " world"
    assert result.text == llama_like.decode(prompt + ids)[len(llama_like.decode(prompt)) :]
