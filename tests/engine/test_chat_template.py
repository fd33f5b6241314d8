"""The chat template renders as transformers renders it from the same GGUF."""

from __future__ import annotations

import pytest

from engine.loader.model_files import DEFAULT_MODEL_FILE, default_model_path
from engine.tokenizer import ChatTemplateError, TextTokenizer

transformers = pytest.importorskip("transformers")

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Name a colour. 🎨"},
    ],
]


@pytest.fixture(scope="module")
def reference_tokenizer():
    path = default_model_path()
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=DEFAULT_MODEL_FILE)


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(smollm_checkpoint, reference_tokenizer, messages, add_generation_prompt):
    ours = smollm_checkpoint.tokenizer
    text = ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    expected = reference_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert text == expected
    assert ours.encode_chat(messages, add_generation_prompt) == reference_tokenizer(expected, add_special_tokens=False)["input_ids"]


def test_default_model_special_ids(smollm_checkpoint):
    tokenizer = smollm_checkpoint.tokenizer
    assert (tokenizer.bos_token_id, tokenizer.eos_token_ids) == (1, (2,))
    assert tokenizer.encode("<|im_start|>user")[0] == 1


def test_template_errors_are_typed(smollm_checkpoint):
    failing = TextTokenizer(smollm_checkpoint.tokenizer.tokenizer, (2,), chat_template="{{ raise_exception('no system role') }}")
    with pytest.raises(ChatTemplateError, match="no system role"):
        failing.apply_chat_template([{"role": "user", "content": "x"}])
    without = TextTokenizer(smollm_checkpoint.tokenizer.tokenizer, (2,))
    with pytest.raises(ChatTemplateError, match="no chat template"):
        without.apply_chat_template([{"role": "user", "content": "x"}])


GENERATION_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] }}<|im_end|>{% endgeneration %}"
    "{% else %}{{ message['content'] }}<|im_end|>{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_a_generation_block_renders_as_transformers_renders_it(smollm_checkpoint, reference_tokenizer, add_generation_prompt):
    """Templates written for assistant-token masks (``{% generation %}``) render, to transformers' text."""
    ours = TextTokenizer(smollm_checkpoint.tokenizer.tokenizer, (2,), chat_template=GENERATION_TEMPLATE)
    messages = CONVERSATIONS[1]
    expected = reference_tokenizer.apply_chat_template(messages, chat_template=GENERATION_TEMPLATE, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert "{% generation %}" in GENERATION_TEMPLATE and "Hello.<|im_end|>" in expected
    assert ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == expected
