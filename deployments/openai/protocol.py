"""OpenAI request bodies and their translation to `SamplingParams`.

Fields the OpenAI API defines are declared here; every other field is passed to
`SamplingParams` (``top_k``, ``min_p``, ``repetition_penalty``, ...), which rejects
unknown names, so a misspelt field is a 400 naming it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from deployments.openai.errors import APIError, from_validation_error
from deployments.openai.tools import NamedToolChoice, Tool, ToolCall, ToolChoice
from sampling.params import MAX_LOGPROBS, SamplingParams

# The tokenizer cannot even look up an id outside u32 (the ingress decodes prompts for the
# detokenizer's context); the engine checks ids against the model's vocabulary.
TokenId = Annotated[int, Field(ge=0, lt=2**32)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def _sampling_params(self, **fields: Any) -> SamplingParams:
        try:
            return SamplingParams(**(self.model_extra or {}), **{k: v for k, v in fields.items() if v is not None})
        except ValidationError as error:
            raise from_validation_error(error) from error
        except TypeError as error:  # a field given both as OpenAI's and as an extra
            raise APIError(400, str(error)) from error


class CompletionRequest(_Request):
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    max_tokens: int | None = 16
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    suffix: None = None
    best_of: int | None = None

    @model_validator(mode="after")
    def _check(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt must not be empty")
        n = (self.model_extra or {}).get("n", 1)
        if self.best_of is not None and self.best_of != n:
            raise ValueError("best_of other than n is not supported")
        return self

    def sampling_params(self) -> SamplingParams:
        return self._sampling_params(max_tokens=self.max_tokens, logprobs=self.logprobs)

    def prompts(self) -> list[str | list[int]]:
        """The prompts, each text or token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if all(isinstance(p, int) for p in prompt):
            return [prompt]  # type: ignore[list-item]
        return list(prompt)  # type: ignore[arg-type]


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


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    add_generation_prompt: bool = True
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True

    @model_validator(mode="after")
    def _check_tools(self) -> ChatCompletionRequest:
        names = [tool.function.name for tool in self.tools or []]
        if len(set(names)) < len(names):
            raise APIError(400, "tools: two tools have the same function name", param="tools")
        if self.tool_choice not in (None, "none", "auto") and not names:
            raise APIError(400, "tool_choice: 'required' and a named function need tools", param="tool_choice")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            raise APIError(400, f"tool_choice: no tool is named {self.tool_choice.function.name!r}", param="tool_choice")
        return self

    @property
    def effective_tool_choice(self) -> ToolChoice:
        """OpenAI's default: "auto" with tools, "none" without."""
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"

    def sampling_params(self) -> SamplingParams:
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(400, "top_logprobs requires logprobs to be true", param="top_logprobs")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        params = self._sampling_params(logprobs=logprobs, max_tokens=max_tokens)
        if max_tokens is None:  # chat: until the context is full unless limited
            params = params.model_copy(update={"max_tokens": None})
        return params

    def client_texts(self) -> list[str]:
        """The client's text that goes into the prompt: message contents, tool calls, tool definitions."""
        calls = [call.function.name + call.function.arguments for m in self.messages for call in m.tool_calls or []]
        tools = [tool.model_dump_json(exclude_none=True) for tool in self.tools or []]
        return [m.text() for m in self.messages] + calls + tools
