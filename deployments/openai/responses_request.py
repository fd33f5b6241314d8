"""The Responses API's request (``POST /v1/responses``), stateless, and its translation to a chat.

A request becomes the `ChatCompletionRequest` it means, so it is checked, limited, rendered and
constrained exactly as a chat is:

- ``instructions`` becomes a system message before ``input``; ``input`` is a string (one user
  message) or a list of items: messages (``input_text`` / ``output_text`` parts or a string),
  ``function_call`` items (an assistant's calls; consecutive ones are one assistant turn) and
  ``function_call_output`` items (a tool message answering a call by ``call_id``);
- ``tools`` (function tools, flat: ``{"type": "function", "name", "parameters", ...}``) and
  ``tool_choice`` (``"auto"``, ``"none"``, ``"required"``, ``{"type": "function", "name"}``),
  ``parallel_tool_calls``;
- ``text.format`` (``text``, ``json_object``, ``json_schema`` with a flat ``name``/``schema``)
  becomes ``response_format``; ``max_output_tokens`` ``max_tokens``; ``temperature``, ``top_p``
  and every other `SamplingParams` field (vLLM's extras) pass through as on chat.

Nothing is stored: ``store: true`` and ``previous_response_id`` are a 400 that says so, as are
``reasoning``, ``include``, ``truncation: "auto"``, ``prompt``, ``conversation`` and ``background``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, model_validator

from deployments.openai.errors import APIError, from_validation_error
from deployments.openai.protocol import ChatCompletionRequest, JsonObjectFormat, TextFormat
from deployments.openai.tools import FUNCTION_NAME_PATTERN

NOT_STORED = "this server stores no responses: send the whole conversation as input (store: false, no previous_response_id)"
REFUSED_FIELDS = {
    "reasoning": "effort and summaries are not server settings here (the reasoning_parser option splits a model's thinking)",
    "include": "no extra output (reasoning, logprobs, search results) is available",
    "prompt": "there are no stored prompt templates",
    "conversation": NOT_STORED,
    "background": "responses run in the foreground only",
    "prompt_cache_key": "prefix caching needs no key here",
    "service_tier": "there is one service tier",
    "metadata": NOT_STORED,
    "top_logprobs": "logprobs are not available on the Responses API here (they are on chat)",
    "max_tool_calls": "not enforced here",
    "stream_options": "there are no stream options for the Responses API here",
}


class ContentPart(BaseModel):
    """A message's text: ``input_text``, or ``output_text`` as a previous response gave it back."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None  # an output's, given back: ignored
    logprobs: list[Any] | None = None


class MessageItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[ContentPart]
    id: str | None = None
    status: str | None = None
    phase: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class FunctionCallItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[ContentPart]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(part.text for part in self.output)


def _item_kind(item: object) -> str:
    return str(item.get("type", "message")) if isinstance(item, dict) else "message"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")] | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(_item_kind),
]


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    name: str


class JsonSchemaTextFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["json_schema"]
    name: str = Field(max_length=64)
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: Annotated[TextFormat | JsonObjectFormat | JsonSchemaTextFormat, Field(discriminator="type")] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoice | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    truncation: Literal["disabled", "auto"] | None = None
    user: str | None = None
    safety_identifier: str | None = None

    @model_validator(mode="after")
    def _stateless(self) -> ResponsesRequest:
        if self.store:
            raise APIError(400, f"store: {NOT_STORED}", param="store")
        if self.previous_response_id is not None:
            raise APIError(400, f"previous_response_id: {NOT_STORED}", param="previous_response_id")
        if self.truncation == "auto":
            raise APIError(400, "truncation: an input longer than the context is a 400, never cut (truncation 'disabled')", param="truncation")
        for name, why in REFUSED_FIELDS.items():
            if (self.model_extra or {}).get(name) not in (None, []):
                raise APIError(400, f"{name} is not supported: {why}", param=name)
        if isinstance(self.input, list) and not self.input:
            raise APIError(400, "input: give at least one item", param="input")
        return self

    def chat_messages(self) -> list[dict[str, Any]]:
        """``instructions`` and ``input`` as chat messages; an assistant's calls join its turn."""
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.instructions}] if self.instructions is not None else []
        items = [MessageItem(role="user", content=self.input)] if isinstance(self.input, str) else self.input
        for item in items:
            if isinstance(item, MessageItem):
                messages.append({"role": item.role, "content": item.text()})
            elif isinstance(item, FunctionCallItem):
                call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
                last = messages[-1] if messages else None
                if last is not None and last["role"] == "assistant":
                    last.setdefault("tool_calls", []).append(call)
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            else:
                messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
        return messages

    def chat_request(self) -> ChatCompletionRequest:
        """The chat this request means (see the module's text); 400s name the Responses API's fields where they differ."""
        fields: dict[str, Any] = {
            "model": self.model,
            "messages": self.chat_messages(),
            "parallel_tool_calls": self.parallel_tool_calls,
            "max_tokens": self.max_output_tokens,
            "stream": self.stream,
        }
        if self.tools:
            fields["tools"] = [{"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True)} for tool in self.tools]
        if self.tool_choice is not None:
            choice = self.tool_choice
            fields["tool_choice"] = {"type": "function", "function": {"name": choice.name}} if isinstance(choice, FunctionToolChoice) else choice
        text_format = self.text.format if self.text is not None else None
        if isinstance(text_format, JsonSchemaTextFormat):
            schema = {"name": text_format.name, "schema": text_format.schema_, "description": text_format.description, "strict": text_format.strict}
            fields["response_format"] = {"type": "json_schema", "json_schema": {k: v for k, v in schema.items() if v is not None}}
        elif text_format is not None:
            fields["response_format"] = {"type": text_format.type}
        sampling = {"temperature": self.temperature, "top_p": self.top_p}
        extras = {**(self.model_extra or {}), **{k: v for k, v in sampling.items() if v is not None}}
        if extras.get("n", 1) != 1:
            raise APIError(400, "n: a response has one output", param="n")
        if "prompt_logprobs" in extras:
            raise APIError(400, "prompt_logprobs is not available on the Responses API (it is on completions and chat)", param="prompt_logprobs")
        chat_only = sorted(set(extras) & set(ChatCompletionRequest.model_fields))
        if chat_only:
            raise APIError(400, f"{chat_only[0]} is a chat field, not one of the Responses API's", param=chat_only[0])
        try:
            return ChatCompletionRequest.model_validate(fields | extras)
        except ValidationError as error:
            raise _responses_error(from_validation_error(error)) from error

    def echo_fields(self) -> dict[str, Any]:
        """The request's settings a response repeats."""
        text_format = (
            self.text.format.model_dump(by_alias=True, exclude_none=True) if self.text is not None and self.text.format is not None else {"type": "text"}
        )
        choice = self.tool_choice.model_dump() if isinstance(self.tool_choice, FunctionToolChoice) else (self.tool_choice or ("auto" if self.tools else "none"))
        return {
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "parallel_tool_calls": self.parallel_tool_calls,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "text": {"format": text_format},
            "tool_choice": choice,
            "tools": [tool.model_dump() for tool in self.tools or []],
            "truncation": "disabled",
            "previous_response_id": None,
            "user": self.user,
        }


RENAMED = {"max_tokens": "max_output_tokens", "messages": "input", "response_format": "text"}


def _responses_error(error: APIError) -> APIError:
    """A chat's 400 with the Responses API's names for the fields it renames."""
    if error.param in RENAMED:
        error.param = RENAMED[error.param]
    return error
