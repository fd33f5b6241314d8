"""Bad words on tokenizers whose post-processor adds a BOS token still fire (issue 13).

The tokenizers are built here (no network): a Llama-2-style SentencePiece BPE (the
``Prepend("▁")`` + ``Replace(" ", "▁")`` normalizer of its tokenizer.json) and a byte-level
BPE, each with a ``TemplateProcessing`` post-processor that puts ``<s>`` first, as the GGUF
loader does for models with ``add_bos_token``. Ids come from `TextTokenizer.encode`, the
callable the ingress and `engine.generate` pass to `tokenize_strings`.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from engine.tokenizer import TextTokenizer
from sampling.batch import SamplingBatch
from sampling.params import SamplingParams
from sampling.sampler import Sampler
from sampling.tokenized import tokenize_strings

SPECIALS = ["<unk>", "<s>", "</s>"]
BOS, EOS = 1, 2


def bpe_tokenizer(alphabet: list[str], merges: list[tuple[str, str]]) -> Tokenizer:
    vocab = {token: i for i, token in enumerate(SPECIALS + alphabet + ["".join(m) for m in merges])}
    tokenizer = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True))
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])
    return tokenizer


def sentencepiece() -> TextTokenizer:
    """Llama-2 layout: "▁" prepended to the input and written for every space."""
    merges = [("▁", "b"), ("▁b", "a"), ("▁ba", "d"), ("▁", "w"), ("▁w", "o"), ("▁wo", "r"), ("▁wor", "d"), ("▁", "a")]
    tokenizer = bpe_tokenizer(["▁", "a", "b", "d", "o", "r", "w"], merges)
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Strip(" ", 1, 0)])
    return TextTokenizer(tokenizer, eos_token_ids=(EOS,), bos_token_id=BOS)


def byte_level() -> TextTokenizer:
    """GPT-2 / Llama-3 layout: bytes as characters, "Ġ" for a space."""
    merges = [("Ġ", "b"), ("Ġb", "a"), ("Ġba", "d"), ("b", "a"), ("ba", "d")]
    tokenizer = bpe_tokenizer(pre_tokenizers.ByteLevel.alphabet(), merges)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return TextTokenizer(tokenizer, eos_token_ids=(EOS,), bos_token_id=BOS)


TOKENIZERS = pytest.mark.parametrize("make", [sentencepiece, byte_level], ids=["sentencepiece", "byte-level"])


def ids(tokenizer: TextTokenizer, *tokens: str) -> tuple[int, ...]:
    return tuple(tokenizer.tokenizer.token_to_id(t) for t in tokens)


@TOKENIZERS
def test_the_tokenizer_adds_bos(make: Callable[[], TextTokenizer]) -> None:
    assert make().encode("bad")[0] == BOS


@TOKENIZERS
def test_bad_words_and_breakers_have_no_post_processor_tokens_the_negative_prompt_has(make: Callable[[], TextTokenizer]) -> None:
    tokenizer = make()
    params = SamplingParams(bad_words=["bad", "a word"], dry_multiplier=0.5, dry_sequence_breakers=["bad"],
                            guidance_scale=2.0, negative_prompt="bad")  # fmt: skip
    strings = tokenize_strings(params, tokenizer.encode)
    assert all(BOS not in sequence for sequence in strings.bad_words)
    assert BOS not in strings.dry_breakers
    assert strings.negative_prompt == tuple(tokenizer.encode("bad"))  # a prompt, as the completion prompt is


def test_the_spaced_variant_is_what_the_model_emits_after_other_text() -> None:
    """Alone, " bad word" encodes to "▁" "▁bad" "▁word"; after other text the model writes "▁bad" "▁word"."""
    tokenizer = sentencepiece()
    assert tokenizer.encode(" bad word", add_special_tokens=False)[0] == ids(tokenizer, "▁")[0]
    strings = tokenize_strings(SamplingParams(bad_words=["bad word"]), tokenizer.encode)
    assert strings.bad_words == (ids(tokenizer, "▁bad", "▁word"),)


def test_byte_level_bad_word_as_given_and_after_a_space() -> None:
    tokenizer = byte_level()
    strings = tokenize_strings(SamplingParams(bad_words=["bad"]), tokenizer.encode)
    assert set(strings.bad_words) == {ids(tokenizer, "bad"), ids(tokenizer, "Ġbad")}


class GreedyRow:
    """One greedy row of a batch on ``tokenizer``'s vocabulary, prompt ``<s>``, with the request's bad words as the ingress tokenizes them."""

    def __init__(self, tokenizer: TextTokenizer, bad_words: list[str]) -> None:
        params = SamplingParams(temperature=0.0, bad_words=bad_words)
        self.batch = SamplingBatch(1, tokenizer.vocab_size, 16, "cpu")
        self.batch.add_request(0, params, [BOS], tokenize_strings(params, tokenizer.encode))
        self.rows = torch.tensor([0])

    def sample(self, favoured: tuple[int, ...]) -> int:
        """The token sampled (and recorded) where the logits favour ``favoured``, most first."""
        logits = torch.zeros(1, self.batch.vocab_size)
        logits[0, list(favoured)] = torch.arange(len(favoured), 0, -1, dtype=torch.float32) * 10
        return int(Sampler()(logits, self.rows, self.batch).sampled_token_ids[0])

    def emitted(self, token: int) -> None:
        """Record ``token`` as the row's next output (as if sampled)."""
        self.batch.record(self.rows, torch.tensor([token]))


@TOKENIZERS
def test_a_one_token_bad_word_is_never_sampled(make: Callable[[], TextTokenizer]) -> None:
    tokenizer = make()
    bad, other = ids(tokenizer, "▁bad" if make is sentencepiece else "bad", "d")
    row = GreedyRow(tokenizer, ["bad"])
    assert [row.sample((bad, other)) for _ in range(3)] == [other] * 3


def test_the_last_token_of_a_bad_word_is_masked_after_its_prefix() -> None:
    tokenizer = sentencepiece()
    a, word = ids(tokenizer, "▁a", "▁word")
    row = GreedyRow(tokenizer, ["a word"])
    assert row.sample((word, a)) == word  # not after "▁a": allowed
    row.emitted(a)
    assert row.sample((word, a)) == a
