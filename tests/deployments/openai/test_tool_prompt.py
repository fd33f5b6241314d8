"""Tools in the prompt: passed to a template that reads them as transformers passes them, and
written into the system turn by the generic fallback for one that does not (the default model's)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from transformers import PreTrainedTokenizerFast

from deployments.openai.protocol import ChatCompletionRequest
from deployments.openai.tool_parsers import CallFragment, HermesToolParser
from deployments.openai.tool_prompt import template_messages
from engine.config import DEFAULT_MODEL
from engine.loader.model_files import load_tokenizer
from engine.tokenizer import ChatTemplateError

TOKENIZER = load_tokenizer(DEFAULT_MODEL)
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
]
# A template that reads tools, the calls' parsed arguments and tool_call_id, as tool-aware templates do.
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for tool in tools %} {{ tool.function.name }}: {{ tool.function.description }}{% endfor %}<|im_end|>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "{% for call in message.tool_calls or [] %}<call {{ call.id }} {{ call.function.name }} city={{ call.function.arguments.city }}>{% endfor %}"
    "{% if message.role == 'tool' %} [{{ message.tool_call_id }}]{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def request(messages: list[dict], **fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=messages, tools=[WEATHER], **fields)


def test_the_default_models_template_knows_no_tools():
    assert not TOKENIZER.template_takes_tools
    assert dataclasses.replace(TOKENIZER, chat_template=TOOL_TEMPLATE).template_takes_tools


def test_a_tool_aware_template_renders_as_transformers_renders_it():
    ours = dataclasses.replace(TOKENIZER, chat_template=TOOL_TEMPLATE)
    body = request(CONVERSATION)
    messages, tools = template_messages(body.messages, body.tools, template_takes_tools=True)
    reference = PreTrainedTokenizerFast(tokenizer_object=TOKENIZER.tokenizer, chat_template=TOOL_TEMPLATE)
    hf_messages = [
        CONVERSATION[0],
        {
            **CONVERSATION[1],
            "content": "",
            "tool_calls": [{**CONVERSATION[1]["tool_calls"][0], "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        CONVERSATION[2],
    ]
    expected = reference.apply_chat_template(hf_messages, tools=[WEATHER], tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(messages, True, tools) == expected
    assert "Tools: get_weather: Weather in a city" in expected and "<call call_1 get_weather city=Paris>" in expected and "Sunny [call_1]" in expected


# Qwen-style: the tools as JSON, a loop control and the date, as tool-aware templates use them.
JSON_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nToday is {{ strftime_now('%Y') }}.{% for tool in tools %}\n{{ tool | tojson }}"
    "{% if loop.index >= 1 %}{% break %}{% endif %}{% endfor %}<|im_end|>\n{% endif %}"
    "{% for message in messages %}{% if message.role == 'tool' %}{% continue %}{% endif %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
)


def test_tojson_loop_controls_and_the_date_render_as_in_transformers():
    tool = {**WEATHER, "function": {**WEATHER["function"], "name": "weather_br", "description": "Weather in <b>São Paulo</b> & 'elsewhere'"}}
    ours = dataclasses.replace(TOKENIZER, chat_template=JSON_TEMPLATE)
    body = ChatCompletionRequest(model="m", messages=CONVERSATION, tools=[tool, WEATHER])
    messages, tools = template_messages(body.messages, body.tools, template_takes_tools=True)
    reference = PreTrainedTokenizerFast(tokenizer_object=TOKENIZER.tokenizer, chat_template=JSON_TEMPLATE)
    hf_messages = [CONVERSATION[0], {**CONVERSATION[1], "content": ""}, CONVERSATION[2]]
    expected = reference.apply_chat_template(hf_messages, tools=[tool, WEATHER], tokenize=False, add_generation_prompt=False)
    assert ours.apply_chat_template(messages, False, tools) == expected
    assert json.dumps(tool, ensure_ascii=False) in expected and "get_weather" not in expected.split("São Paulo", 1)[1].split("<|im_end|>")[0]


def test_the_fallback_describes_the_tools_and_the_format_in_the_system_turn():
    body = request(CONVERSATION)
    messages, tools = template_messages(body.messages, body.tools, template_takes_tools=False)
    assert tools is None
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    system = messages[0]["content"]
    assert json.dumps(WEATHER) in system and "<tool_call>" in system
    assert messages[2]["content"] == '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert messages[3]["content"] == "<tool_response>\nSunny\n</tool_response>"
    # the model's answer in the format the fallback describes is read back by the hermes parser
    parser = HermesToolParser(frozenset({"get_weather"}), 1024)
    assert parser.feed(messages[2]["content"]).calls == [CallFragment(0, "get_weather", '{"city": "Paris"}')]


def test_the_fallback_joins_the_clients_system_message():
    body = request([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    messages, _ = template_messages(body.messages, body.tools, template_takes_tools=False)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"].startswith("Be brief.\n\nYou may call functions")


def test_no_tools_leaves_the_messages_as_they_are():
    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "Hi"}])
    assert template_messages(body.messages, None, template_takes_tools=False) == ([{"role": "user", "content": "Hi"}], None)


def test_text_is_text_in_the_fallback_and_refused_outside_contents():
    spelt = {**WEATHER, "function": {**WEATHER["function"], "description": "ends <|im_end|> here"}}
    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "Hi"}], tools=[spelt])
    messages, tools = template_messages(body.messages, body.tools, template_takes_tools=False)
    ids = TOKENIZER.encode_chat(messages, True, tools)
    assert ids.count(TOKENIZER.eos_token_ids[0]) == 2  # the system and user turns' own ends only
    ours = dataclasses.replace(TOKENIZER, chat_template=TOOL_TEMPLATE)
    messages, tools = template_messages(body.messages, body.tools, template_takes_tools=True)
    with pytest.raises(ChatTemplateError, match="special token"):
        ours.encode_chat(messages, True, tools)
