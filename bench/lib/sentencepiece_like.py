"""SentencePiece-style tokenizers trained on the benchmark's own text, for the decoder families
that the default model does not have (no network, under a second to train).

- ``byte-fallback``: Llama-2 / Mistral layout: Metaspace (``▁``) pieces, ``<0xXX>`` tokens for
  every byte, so characters outside the learned alphabet (CJK, emoji) become byte runs, and the
  ``Replace``/``ByteFallback``/``Fuse``/``Strip`` decoder.
- ``metaspace``: the same pieces with the ``Metaspace`` decoder and no byte fallback (unknown
  characters become ``<unk>``).
"""

from __future__ import annotations

import json

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

VOCAB_SIZE = 4000
ALPHABET = 48
"""Most frequent chars kept as tokens; rarer ones (CJK, emoji) fall back to bytes or ``<unk>``."""


def train(text: str, byte_fallback: bool) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=byte_fallback))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=ALPHABET)
    tokenizer.train_from_iterator([text], trainer)
    if not byte_fallback:
        tokenizer.decoder = decoders.Metaspace(prepend_scheme="always")
        return tokenizer
    spec = json.loads(tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))  # ordinary vocab entries, as in Llama-2
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return tokenizer
