"""Small tokenizers of each decoder family the loaders accept, built in the tests (no network).

Decoding is what the detokenizer depends on, so each is a vocabulary and a decoder as the
real models ship them: byte-level BPE (GPT-2, Llama-3, Qwen2, SmolLM), SentencePiece-style
Metaspace with byte fallback and the ``Replace``/``ByteFallback``/``Fuse``/``Strip`` decoder
(Llama-2, Mistral), and Metaspace without byte fallback. Each has ``<s>``/``</s>`` specials,
an added non-special token, words with and without a leading space, and whole characters
(CJK, é) that the byte-fallback family also has as bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import AddedToken, Tokenizer, decoders, models

WORDS = ["Hello", "world", "the", "true", "again", "中", "文", "é", "!", "\n", "a", "b", " "]
SPECIALS = ["<s>", "</s>"]
ADDED = "<tool>"


@dataclass(frozen=True)
class Family:
    name: str
    tokenizer: Tokenizer
    word_ids: list[int]
    """Ordinary tokens, with and without a leading space."""
    byte_ids: dict[int, int]
    """Byte of each byte token (byte-fallback or byte-level single-byte tokens); empty if none."""
    special_ids: list[int]
    separator: int
    """An ordinary token with text, ending in a whole character."""

    def ids_of_bytes(self, data: bytes) -> list[int]:
        id_of_byte = {b: i for i, b in self.byte_ids.items()}
        return [id_of_byte[b] for b in data]


def _finish(name: str, vocab: dict[str, int], decoder, byte_ids: dict[int, int], spell) -> Family:
    """``spell(text)``: the vocab entry of a word (``" the"`` is ``"▁the"`` or ``"Ġthe"``)."""
    for word in WORDS:
        vocab.setdefault(spell(word), len(vocab))
        vocab.setdefault(spell(" " + word), len(vocab))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=name == "byte-fallback"))
    tokenizer.decoder = decoder
    tokenizer.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS])
    tokenizer.add_tokens([AddedToken(ADDED, special=False)])
    words = sorted({vocab[spell(w)] for w in WORDS} | {vocab[spell(" " + w)] for w in WORDS})
    specials = [tokenizer.token_to_id(s) for s in SPECIALS]
    return Family(name, tokenizer, [*words, tokenizer.token_to_id(ADDED)], byte_ids, specials, vocab[spell(" the")])


def _metaspace_spelling(text: str) -> str:
    return text.replace(" ", "▁")


def byte_fallback() -> Family:
    """Llama-2 / Mistral: ``▁`` for spaces, ``<0xXX>`` for bytes no token covers."""
    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}}
    decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return _finish("byte-fallback", vocab, decoder, {1 + b: b for b in range(256)}, _metaspace_spelling)


def metaspace() -> Family:
    """Metaspace without byte fallback (older SentencePiece conversions)."""
    return _finish("metaspace", {"<unk>": 0}, decoders.Metaspace(), {}, _metaspace_spelling)


def byte_level() -> Family:
    """GPT-2 style: every byte is a printable char; words are their bytes' chars."""
    byte_chars = _byte_level_chars()
    vocab = {"<unk>": 0, **{c: 1 + b for b, c in enumerate(byte_chars)}}

    def spell(text: str) -> str:
        return "".join(byte_chars[b] for b in text.encode())

    return _finish("byte-level", vocab, decoders.ByteLevel(), {1 + b: b for b in range(256)}, spell)


def _byte_level_chars() -> list[str]:
    """GPT-2's printable char for each byte, by byte value."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = chr(256 + extra), extra + 1
    return [chars[b] for b in range(256)]


FAMILIES = {"byte-level": byte_level, "byte-fallback": byte_fallback, "metaspace": metaspace}
