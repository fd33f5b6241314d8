"""What a chat prompt is made of, shared by every request that renders the chat template
(``/v1/chat/completions`` and ``/tokenize``): the messages, the tools offered to the template,
and vLLM's rendering options.

- ``add_generation_prompt`` (default true): the template opens the assistant's turn;
- ``continue_final_message`` (vLLM's, default false): the prompt ends inside the last message,
  without the markup that closes it, so the model continues it (prefilling an answer); as in
  vLLM, it cannot be combined with ``add_generation_prompt``, which must then be false;
- ``chat_template_kwargs`` (vLLM's): more variables for the template, such as ``enable_thinking``;
  they count against the prompt's size limit as JSON, and may not set the variables the request
  sets itself (``messages``, ``tools``, ``add_generation_prompt``, ``bos_token``, ``eos_token``).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from deployments.openai.errors import APIError
from deployments.openai.tools import Tool, ToolCall


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _check_tool_fields(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages have tool_calls")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatPrompt(BaseModel):
    """The fields that make a chat's prompt."""

    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check_prompt_options(self) -> ChatPrompt:
        if self.continue_final_message and self.add_generation_prompt:
            raise APIError(
                400,
                "continue_final_message and add_generation_prompt cannot both be true (as in vLLM): set add_generation_prompt false",
                param="continue_final_message",
            )
        names = [tool.function.name for tool in self.tools or []]
        if len(set(names)) < len(names):
            raise APIError(400, "tools: two tools have the same function name", param="tools")
        return self

    def template_options(self) -> dict[str, Any]:
        """The keyword options of `engine.tokenizer.TextTokenizer.encode_chat` beyond the messages and tools."""
        return {"continue_final_message": self.continue_final_message, "template_kwargs": self.chat_template_kwargs}

    def client_texts(self) -> list[str]:
        """The client's text that goes into the prompt: message contents, tool calls, tool definitions, template variables."""
        calls = [call.function.name + call.function.arguments for m in self.messages for call in m.tool_calls or []]
        tools = [tool.model_dump_json(exclude_none=True) for tool in self.tools or []]
        variables = [json.dumps(self.chat_template_kwargs, ensure_ascii=False)] if self.chat_template_kwargs else []
        return [m.text() for m in self.messages] + calls + tools + variables
