"""The prompts of `bench.routing`: token-id prompts that share long prefixes, or none.

Every prompt starts with the model's chat header (`chat_header`: the template's markup and default
system prompt up to the user's text), so that prompts share their first block as
chat prompts do, and a router keyed on too few tokens would see one key. Then:

- ``many_prefixes``: one of ``num_prefixes`` long random "system prompts", picked uniformly, then a
  short random suffix (the user's message);
- ``no_sharing``: random tokens of the same total length, unique per request;
- ``uneven``: one hot prefix for ``HOT_SHARE`` of the requests, the others uniformly over a tail
  of ``num_prefixes // 2`` more.

Tokens are drawn from ordinary ids of the vocabulary, seeded, so both policies see the same prompts.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from enum import StrEnum
from functools import cache

from engine.loader.model_files import load_tokenizer

TOKEN_RANGE = (1000, 40000)
HOT_SHARE = 0.7


class WorkloadName(StrEnum):
    MANY_PREFIXES = "many_prefixes"
    NO_SHARING = "no_sharing"
    UNEVEN = "uneven"


@dataclass(frozen=True)
class PromptShape:
    prefix_tokens: int
    """Shared prefix length, the chat header included."""
    suffix_tokens: int
    num_prefixes: int


class PromptSource:
    """A workload's prompts: ``next(rng)`` draws one (the rng is the caller's, one per client)."""

    def __init__(self, workload: WorkloadName, shape: PromptShape, header: list[int], seed: int) -> None:
        self.workload, self.shape, self.header = workload, shape, header
        build = random.Random(seed)
        count = shape.num_prefixes if workload is WorkloadName.MANY_PREFIXES else 1 + shape.num_prefixes // 2
        self.prefixes = [header + _random_tokens(build, shape.prefix_tokens - len(header)) for _ in range(count)]

    def next(self, rng: random.Random) -> list[int]:
        suffix = _random_tokens(rng, self.shape.suffix_tokens)
        if self.workload is WorkloadName.NO_SHARING:
            return self.header + _random_tokens(rng, self.shape.prefix_tokens - len(self.header)) + suffix
        if self.workload is WorkloadName.UNEVEN:
            prefix = self.prefixes[0] if rng.random() < HOT_SHARE else rng.choice(self.prefixes[1:])
            return prefix + suffix
        return rng.choice(self.prefixes) + suffix


@cache
def chat_header(model: str) -> list[int]:
    """``model``'s chat prompt up to the user's text, where two chats' prompts part (the default model's:
    ``<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n<|im_start|>user\\n``, 24 tokens)."""
    tokenizer = load_tokenizer(model)
    first, second = (tokenizer.encode_chat([{"role": "user", "content": text}]) for text in ("Hello there.", "What is 2 + 2?"))
    return [a for a, _ in itertools.takewhile(lambda pair: pair[0] == pair[1], zip(first, second))]


def _random_tokens(rng: random.Random, count: int) -> list[int]:
    return [rng.randrange(*TOKEN_RANGE) for _ in range(count)]
