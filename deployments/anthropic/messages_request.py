"""The Messages API's request (``POST /v1/messages``, ``/v1/messages/count_tokens``) and its
translation to the chat it means, so it is checked, limited, rendered and constrained as a chat is:

- ``system`` (text, or text blocks) becomes a system message; each message's ``text`` blocks its
  text; an assistant's ``tool_use`` blocks its tool calls (``input`` as the arguments' JSON); a user's
  ``tool_result`` blocks tool messages answering those calls, before the user's own text;
- ``tools`` (``name``, ``description``, ``input_schema``) become function tools; ``tool_choice``
  ``auto`` / ``any`` / ``tool`` / ``none`` become ``auto`` / ``required`` / the named function /
  ``none``, and ``disable_parallel_tool_use`` turns parallel calls off;
- ``output_config.format`` (a JSON schema) becomes ``response_format``;
- ``max_tokens``, ``stop_sequences`` (``stop``), ``temperature``, ``top_p``, ``top_k`` (which the
  API had and older clients send), ``stream``.

Not taken (a 400 naming the field): images, documents and other block types, ``thinking``
enabled, ``output_config.effort``, ``mcp_servers``, ``container``, server tools; unknown fields, as
Anthropic's API does. ``cache_control`` (on the request, blocks and tools) is accepted and has no
effect (prefix caching needs no hints).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, model_validator

from deployments.openai.errors import APIError, from_validation_error
from deployments.openai.protocol import ChatCompletionRequest
from deployments.openai.tools import FUNCTION_NAME_PATTERN


class TextBlock(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None
    citations: list[Any] | None = None


class ToolUseBlock(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlock(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[TextBlock] = ""
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(block.text for block in self.content)


def _block_kind(block: object) -> str:
    kind = block.get("type") if isinstance(block, dict) else None
    return kind if kind in ("text", "tool_use", "tool_result") else "unsupported"


class UnsupportedBlock(BaseModel):
    type: str

    @model_validator(mode="after")
    def _refuse(self) -> UnsupportedBlock:
        raise ValueError(f"content blocks of type {self.type!r} are not supported (text, tool_use and tool_result are)")


ContentBlock = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ToolResultBlock, Tag("tool_result")]
    | Annotated[UnsupportedBlock, Tag("unsupported")],
    Discriminator(_block_kind),
]


class MessageParam(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]

    def blocks(self) -> list[TextBlock | ToolUseBlock | ToolResultBlock]:
        return [TextBlock(type="text", text=self.content)] if isinstance(self.content, str) else self.content  # type: ignore[list-item]

    def chat_messages(self) -> list[dict[str, Any]]:
        blocks = self.blocks()
        text = "".join(block.text for block in blocks if isinstance(block, TextBlock))
        if self.role == "assistant":
            if any(isinstance(block, ToolResultBlock) for block in blocks):
                raise APIError(400, "messages: tool_result blocks belong in user messages", param="messages")
            calls = [_call(block) for block in blocks if isinstance(block, ToolUseBlock)]
            return [{"role": "assistant", "content": text or None, **({"tool_calls": calls} if calls else {})}]
        if any(isinstance(block, ToolUseBlock) for block in blocks):
            raise APIError(400, "messages: tool_use blocks belong in assistant messages", param="messages")
        results = [{"role": "tool", "tool_call_id": block.tool_use_id, "content": block.text()} for block in blocks if isinstance(block, ToolResultBlock)]
        has_text = any(isinstance(block, TextBlock) for block in blocks)
        return results + ([{"role": "user", "content": text}] if has_text or not results else [])


def _call(block: ToolUseBlock) -> dict[str, Any]:
    return {"id": block.id, "type": "function", "function": {"name": block.name, "arguments": json.dumps(block.input, ensure_ascii=False)}}


class ToolParam(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = None


class ToolChoiceParam(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self) -> ToolChoiceParam:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError("a name goes with tool_choice of type 'tool', and only there")
        return self

    def chat_form(self) -> object:
        if self.type == "tool":
            return {"type": "function", "function": {"name": self.name}}
        return {"auto": "auto", "any": "required", "none": "none"}[self.type]


class ThinkingParam(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["disabled"]


class JsonOutputFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    """Anthropic's structured outputs: ``format`` constrains the text to a JSON schema; ``effort`` (reasoning) is not taken."""

    model_config = ConfigDict(extra="forbid")
    format: JsonOutputFormat | None = None
    effort: None = None


class Metadata(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user_id: str | None = None


class CountTokensRequest(BaseModel):
    """What makes the prompt: ``/v1/messages/count_tokens`` takes this alone."""

    model_config = ConfigDict(extra="forbid")
    model: str
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoiceParam | None = None
    thinking: ThinkingParam | None = None
    output_config: OutputConfig | None = None
    cache_control: dict[str, Any] | None = None

    def chat_fields(self) -> dict[str, Any]:
        system = self.system if isinstance(self.system, str) or self.system is None else "".join(block.text for block in self.system)
        messages = ([{"role": "system", "content": system}] if system is not None else []) + [m for message in self.messages for m in message.chat_messages()]
        fields: dict[str, Any] = {"model": self.model, "messages": messages}
        if self.tools:
            fields["tools"] = [
                {"type": "function", "function": {"name": t.name, "parameters": t.input_schema, **({"description": t.description} if t.description else {})}}
                for t in self.tools
            ]
        if self.tool_choice is not None:
            fields["tool_choice"] = self.tool_choice.chat_form()
            fields["parallel_tool_calls"] = not self.tool_choice.disable_parallel_tool_use
        if self.output_config is not None and self.output_config.format is not None:
            fields["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": self.output_config.format.schema_}}
        return fields

    def chat_request(self) -> ChatCompletionRequest:
        return _chat(self.chat_fields())


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None

    def chat_request(self) -> ChatCompletionRequest:
        sampling = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "stop": self.stop_sequences}
        fields = self.chat_fields() | {"max_tokens": self.max_tokens, "stream": self.stream}
        return _chat(fields | {name: value for name, value in sampling.items() if value is not None})


RENAMED = {"stop": "stop_sequences", "response_format": "output_config"}


def _chat(fields: dict[str, Any]) -> ChatCompletionRequest:
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as error:
        refused = from_validation_error(error)
        refused.param = RENAMED.get(refused.param or "", refused.param)
        raise refused from error
