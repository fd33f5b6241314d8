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


THINKING_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
PREFILLED = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "The colour is "}]


@pytest.mark.parametrize("messages", [*CONVERSATIONS, PREFILLED])
def test_continue_final_message_matches_transformers(smollm_checkpoint, reference_tokenizer, messages):
    ours = smollm_checkpoint.tokenizer
    text = ours.apply_chat_template(messages, add_generation_prompt=False, continue_final_message=True)
    expected = reference_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False, continue_final_message=True)
    assert text == expected and not text.endswith("<|im_end|>\n")
    ids = ours.encode_chat(messages, False, continue_final_message=True)
    assert ids == reference_tokenizer(expected, add_special_tokens=False)["input_ids"]


def test_continue_final_message_keeps_a_message_that_spells_a_special_token_text(smollm_checkpoint):
    ours = smollm_checkpoint.tokenizer
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "I write <|im_end|> as text"}]
    ids = ours.encode_chat(messages, False, continue_final_message=True)
    assert ours.decode(ids, skip_special_tokens=False).endswith("I write <|im_end|> as text")
    benign = ours.encode_chat([messages[0], {"role": "assistant", "content": "I write x as text"}], False, continue_final_message=True)
    im_end = ours.encode("<|im_end|>", add_special_tokens=False)[0]
    assert ids.count(im_end) == benign.count(im_end)  # the markup's alone


@pytest.mark.parametrize("enable_thinking", [True, False])
def test_chat_template_kwargs_reach_the_template_as_transformers_passes_them(smollm_checkpoint, reference_tokenizer, enable_thinking):
    ours = TextTokenizer(smollm_checkpoint.tokenizer.tokenizer, (2,), chat_template=THINKING_TEMPLATE)
    messages = CONVERSATIONS[0]
    text = ours.apply_chat_template(messages, template_kwargs={"enable_thinking": enable_thinking})
    expected = reference_tokenizer.apply_chat_template(
        messages, chat_template=THINKING_TEMPLATE, tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking
    )
    assert text == expected and ("<think>" in text) is not enable_thinking


def test_chat_template_kwargs_cannot_set_the_requests_own_variables_or_spell_special_tokens(smollm_checkpoint):
    ours = smollm_checkpoint.tokenizer
    with pytest.raises(ChatTemplateError, match="messages"):
        ours.encode_chat(CONVERSATIONS[0], template_kwargs={"messages": []})
    with pytest.raises(ChatTemplateError, match="special token"):
        ours.encode_chat(CONVERSATIONS[0], template_kwargs={"note": "<|im_start|>"})


def test_continue_final_message_needs_text_to_continue(smollm_checkpoint):
    with pytest.raises(ChatTemplateError, match="continue_final_message"):
        smollm_checkpoint.tokenizer.apply_chat_template([{"role": "assistant", "content": "  "}], False, continue_final_message=True)
