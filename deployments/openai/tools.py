"""Tool calling on the wire: ``tools``, ``tool_choice``, assistant ``tool_calls``, and the
JSON schema that ``tool_choice`` "required" or a named function constrains the output to.

A function's ``parameters`` is a JSON schema; it reaches the model as the client wrote it
(in the chat template, or the generic fallback's system turn: `deployments.openai.tool_prompt`).
"""

from __future__ import annotations

import secrets
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from deployments.openai.model_json import read_json

FUNCTION_NAME_PATTERN = r"^[A-Za-z0-9_.:-]{1,64}$"
"""OpenAI's rule for function names (letters, digits, ``_.:-``, at most 64)."""


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str


class NamedToolChoice(BaseModel):
    """``{"type": "function", "function": {"name": ...}}``: the model must call this function."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(BaseModel):
    """A call's function: its name and its arguments, a JSON object as text."""

    model_config = ConfigDict(extra="forbid")
    name: str
    arguments: str


class ToolCall(BaseModel):
    """One call of an assistant message, as the API sends it and a client sends it back."""

    model_config = ConfigDict(extra="forbid")
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall

    @classmethod
    def new(cls, name: str, arguments: str) -> ToolCall:
        return cls(id=f"call_{secrets.token_hex(12)}", function=FunctionCall(name=name, arguments=arguments))

    def parsed_arguments(self) -> object:
        """The arguments as JSON values when they parse, else the text as sent."""
        read = read_json(self.function.arguments)
        return self.function.arguments if read is None else read.value

    def template_form(self) -> dict[str, object]:
        """The call as Hugging Face chat templates read it, ``function.arguments`` parsed."""
        return {"id": self.id, "type": self.type, "function": {"name": self.function.name, "arguments": self.parsed_arguments()}}


class FunctionCallDelta(BaseModel):
    """A piece of a call's function: its name in the call's first piece, and a piece of its arguments."""

    model_config = ConfigDict(extra="forbid")
    name: str | None = None
    arguments: str


class ToolCallDelta(BaseModel):
    """A stream chunk's piece of a call, as vLLM streams them: the call's first piece has its ``id``,
    ``type`` and name, the later ones only ``index`` and more arguments; the pieces' arguments
    concatenate to the call's."""

    model_config = ConfigDict(extra="forbid")
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta

    @classmethod
    def opening(cls, index: int, call: ToolCall) -> ToolCallDelta:
        return cls(index=index, id=call.id, type=call.type, function=FunctionCallDelta(name=call.function.name, arguments=call.function.arguments))

    @classmethod
    def more_arguments(cls, index: int, arguments: str) -> ToolCallDelta:
        return cls(index=index, function=FunctionCallDelta(arguments=arguments))

    def wire(self) -> dict[str, object]:
        return self.model_dump(exclude_none=True)


def parameters_schema(function: FunctionDefinition) -> dict[str, Any]:
    """The schema of a function's arguments: its ``parameters``, or any JSON object."""
    return function.parameters if function.parameters is not None else {"type": "object"}


def call_schema(function: FunctionDefinition) -> dict[str, Any]:
    """``{"name": <this name>, "arguments": <its parameters>}``: one call, as the constrained output writes it."""
    return {
        "type": "object",
        "properties": {"name": {"const": function.name}, "arguments": parameters_schema(function)},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def required_calls_schema(tools: list[Tool], parallel_tool_calls: bool) -> dict[str, Any]:
    """``tool_choice: "required"``: a JSON array of one call (or more, with parallel calls) of any of the tools."""
    items = {"anyOf": [call_schema(tool.function) for tool in tools]}
    schema: dict[str, Any] = {"type": "array", "items": items, "minItems": 1}
    return schema if parallel_tool_calls else schema | {"maxItems": 1}
