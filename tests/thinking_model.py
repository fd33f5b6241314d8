"""A tiny reasoning model for tests: a ``tiny-random``-shaped Llama whose greedy decoding always
writes the same thinking and answer, with the default model's tokenizer plus ``<think>`` and
``</think>`` (added as Qwen3's and DeepSeek-R1's tokenizers add them: ordinary, not special, tokens,
so the detokenizer writes them into the text) and a Qwen3-style chat template (thinking on unless
``chat_template_kwargs`` set ``enable_thinking`` false, which writes an empty thinking in the prompt).

The weights make a bigram model: every layer's attention and MLP output projections are zero, so
the residual stream at a position is its token's embedding, and each token of `CHAIN` has an
embedding of its own basis direction whose logit the head puts on the next token of the chain.
Greedy decoding after the prompt's last token (the template's ``\\n`` after ``assistant``) writes
``<think>`` `REASONING` ``</think>`` `ANSWER` and EOS; after an empty thinking (``\\n\\n``) it writes
`ANSWER` alone. Every other logit is small and seeded (a grammar that refuses the chain's token picks
among them the same way each time). `write_thinking_model` writes the HF folder the engine loads.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import tokenizers

from bench.lib.hf_export import export_hf_folder
from engine.loader.checkpoint import Checkpoint
from engine.loader.model_files import default_tokenizer
from engine.loader.random_shapes import RANDOM_MODEL_SHAPES, TINY_RANDOM
from engine.loader.random_weights import random_weights
from engine.tokenizer import TextTokenizer

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
REASONING = "The user wants the capital of France"
ANSWER = "Paris is it."
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}{% endif %}"
)
CHAIN_LOGIT = 10.0
"""The head's weight from a chain token's direction to its next token (the normed direction is 8 long)."""


def thinking_tokenizer() -> TextTokenizer:
    """The default model's tokenizer with ``<think>`` and ``</think>`` as ordinary added tokens, and `CHAT_TEMPLATE`."""
    base = default_tokenizer()
    tokenizer = tokenizers.Tokenizer.from_str(base.tokenizer.to_str())
    tokenizer.add_tokens(
        [tokenizers.AddedToken(THINK_OPEN, special=False, normalized=False), tokenizers.AddedToken(THINK_CLOSE, special=False, normalized=False)]
    )
    return TextTokenizer(tokenizer=tokenizer, eos_token_ids=base.eos_token_ids, bos_token_id=base.bos_token_id, chat_template=CHAT_TEMPLATE)


def chain(tokenizer: TextTokenizer) -> list[tuple[int, int]]:
    """(token, next token) for every step greedy decoding takes: from the prompt's end with thinking on
    and with thinking off, through the thinking and the answer, to EOS."""
    ids = tokenizer.tokenizer.token_to_id

    def words(text: str) -> list[int]:
        return tokenizer.tokenizer.encode(text, add_special_tokens=False).ids

    thinking_on = [*words("\n"), ids(THINK_OPEN), *words(REASONING), ids(THINK_CLOSE), *words(ANSWER), tokenizer.eos_token_ids[0]]
    steps = list(zip(thinking_on, thinking_on[1:]))
    steps.append((words("\n\n")[0], words(ANSWER)[0]))  # thinking off: the prompt ends with an empty thinking
    sources = [source for source, _ in steps]
    assert len(set(sources)) == len(sources), "a bigram model needs each chain token once"
    return steps


def thinking_checkpoint() -> Checkpoint:
    """The model's checkpoint, the same on every machine (seeded, made on the CPU)."""
    tokenizer = thinking_tokenizer()
    config = replace(RANDOM_MODEL_SHAPES[TINY_RANDOM], vocab_size=tokenizer.tokenizer.get_vocab_size(with_added_tokens=True))
    weights = random_weights(config)
    for name, tensor in weights.items():
        if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            tensor.zero_()
    steps = chain(tokenizer)
    assert len(steps) <= config.hidden_size
    embed, head = weights["embed_tokens.weight"], weights["lm_head.weight"]
    for direction, (token, following) in enumerate(steps):
        embed[token] = 0.0
        embed[token, direction] = 1.0
        head[following, direction] = CHAIN_LOGIT
    return Checkpoint(name="thinking-tiny", config=config, weights=weights, tokenizer=tokenizer)


def write_thinking_model(folder: Path) -> Path:
    """The model as a HF folder (config, safetensors, tokenizer and template) in ``folder``; returns it."""
    return export_hf_folder(thinking_checkpoint(), folder)
