"""Build a Hugging Face ``tokenizers.Tokenizer`` from GGUF tokenizer metadata.

Only byte-level BPE vocabularies (``tokenizer.ggml.model == "gpt2"``) are supported.
The pre-tokenizer follows ``tokenizer.ggml.pre`` the way the original Hugging Face
``tokenizer.json`` of each model family defines it; an unknown value raises.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


class UnsupportedGGUFTokenizerError(ValueError):
    """The GGUF metadata describes a tokenizer this module cannot build."""


def _gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _smollm() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2()])


def _regex_then_bytes(pattern: str) -> Callable[[], pre_tokenizers.PreTokenizer]:
    def build() -> pre_tokenizers.PreTokenizer:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )

    return build


PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    "default": _gpt2,
    "gpt2": _gpt2,
    "smollm": _smollm,
    "llama-bpe": _regex_then_bytes(_LLAMA3_PATTERN),
    "llama3": _regex_then_bytes(_LLAMA3_PATTERN),
    "qwen2": _regex_then_bytes(_QWEN2_PATTERN),
}


def _pre_tokenizer(name: str) -> pre_tokenizers.PreTokenizer:
    try:
        return PRE_TOKENIZERS[name]()
    except KeyError:
        known = ", ".join(sorted(PRE_TOKENIZERS))
        raise UnsupportedGGUFTokenizerError(f"unsupported tokenizer.ggml.pre {name!r} (supported: {known})") from None


def _added_tokens(tokens: Sequence[str], token_types: Sequence[int]) -> list[AddedToken]:
    """Control tokens become special added tokens, user-defined ones plain added tokens."""
    kinds = {TOKEN_TYPE_CONTROL: True, TOKEN_TYPE_USER_DEFINED: False}
    return [AddedToken(tok, special=kinds[kind], normalized=False) for tok, kind in zip(tokens, token_types) if kind in kinds]


def _bos_processor(fields: Mapping[str, object], tokens: Sequence[str]) -> processors.PostProcessor:
    bos_id = int(fields["tokenizer.ggml.bos_token_id"])  # type: ignore[arg-type]
    bos = tokens[bos_id]
    return processors.TemplateProcessing(single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, bos_id)])


def tokenizer_from_gguf(fields: Mapping[str, object]) -> Tokenizer:
    """Build the tokenizer that GGUF metadata ``fields`` (key -> decoded value) describes.

    Raises `UnsupportedGGUFTokenizerError` for a non-``gpt2`` model or an unknown
    ``tokenizer.ggml.pre``; ``KeyError`` if tokens or merges are missing.
    """
    model_name = fields.get("tokenizer.ggml.model")
    if model_name != "gpt2":
        raise UnsupportedGGUFTokenizerError(f"unsupported tokenizer.ggml.model {model_name!r} (only byte-level BPE 'gpt2')")
    tokens: list[str] = list(fields["tokenizer.ggml.tokens"])  # type: ignore[call-overload]
    merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"]]  # type: ignore[attr-defined]
    token_types: list[int] = list(fields.get("tokenizer.ggml.token_type", []))  # type: ignore[call-overload]
    pre = _pre_tokenizer(str(fields.get("tokenizer.ggml.pre", "default")))

    vocab = {tok: i for i, tok in reversed(list(enumerate(tokens)))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = pre
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_tokens(_added_tokens(tokens, token_types))
    if fields.get("tokenizer.ggml.add_bos_token", False):
        tokenizer.post_processor = _bos_processor(fields, tokens)
    return tokenizer
