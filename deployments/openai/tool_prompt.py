"""A chat request's messages and tools as the chat template takes them.

A template that reads ``tools`` gets them as Hugging Face passes them (``tools=`` in the render,
each ``{"type": "function", "function": {...}}``), assistant messages with their ``tool_calls``
and ``tool`` messages with their ``tool_call_id``.

A template that knows nothing of tools (the default model's) gets the generic fallback, in
the spirit of llama.cpp's generic tool format: the tools and the call format are described
in the system turn (appended to the client's system message, or as a system message of
their own), and the conversation is written in that format, so only the ordinary roles
reach the template:

- an assistant message's calls follow its text, one ``<tool_call>{"name", "arguments"}</tool_call>`` each;
- a ``tool`` message becomes a user message ``<tool_response>content</tool_response>`` (as Qwen's template writes it).

The model is asked to answer in the same ``<tool_call>`` format, which the ``hermes`` parser reads.
"""

from __future__ import annotations

import json
from typing import Any

from deployments.openai.chat_prompt import ChatMessage
from deployments.openai.tools import Tool, ToolCall

FALLBACK_INSTRUCTIONS = """You may call functions to answer. These are the functions, in JSON:
<tools>
{tools}
</tools>
To call a function, answer with one block per call, each a JSON object with the function's name and its arguments:
<tool_call>
{{"name": "<function name>", "arguments": {{"<argument>": "<value>"}}}}
</tool_call>
The results come back as <tool_response></tool_response> blocks."""


def template_messages(
    messages: list[ChatMessage], tools: list[Tool] | None, template_takes_tools: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages, and the tools when the template takes them, for `TextTokenizer.encode_chat`."""
    if template_takes_tools:
        tool_dicts = [tool.model_dump(exclude_none=True) for tool in tools] if tools else None
        return [native_message(m) for m in messages], tool_dicts
    written = [fallback_message(m) for m in messages]
    return (with_tools_in_system_turn(written, tools) if tools else written), None


def native_message(message: ChatMessage) -> dict[str, Any]:
    rendered: dict[str, Any] = {"role": message.role, "content": message.text()}
    if message.tool_calls:
        rendered["tool_calls"] = [call.template_form() for call in message.tool_calls]
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
    return rendered


def fallback_message(message: ChatMessage) -> dict[str, str]:
    if message.role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{message.text()}\n</tool_response>"}
    calls = "".join(f"\n{hermes_call(call)}" for call in message.tool_calls or [])
    return {"role": message.role, "content": message.text() + calls}


def hermes_call(call: ToolCall) -> str:
    body = json.dumps({"name": call.function.name, "arguments": call.parsed_arguments()}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def with_tools_in_system_turn(messages: list[dict[str, str]], tools: list[Tool]) -> list[dict[str, str]]:
    described = "\n".join(json.dumps(tool.model_dump(exclude_none=True), ensure_ascii=False) for tool in tools)
    instructions = FALLBACK_INSTRUCTIONS.format(tools=described)
    if messages and messages[0]["role"] in ("system", "developer"):
        first = messages[0]
        return [{**first, "content": f"{first['content']}\n\n{instructions}"}, *messages[1:]]
    return [{"role": "system", "content": instructions}, *messages]
