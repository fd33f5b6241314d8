"""OpenAI request bodies and their translation to `SamplingParams`.

Fields the OpenAI API defines are declared here; every other field is passed to
`SamplingParams` (``top_k``, ``min_p``, ``repetition_penalty``, ``structured_outputs``, ...),
which rejects unknown names, so a misspelt field is a 400 naming it. ``response_format``
becomes ``structured_outputs``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from deployments.openai.chat_prompt import ChatPrompt
from deployments.openai.errors import APIError, from_validation_error
from deployments.openai.tools import NamedToolChoice, Tool, ToolChoice
from sampling.params import MAX_LOGPROBS, SamplingParams
from sampling.structured_outputs import StructuredOutputs

# The tokenizer cannot even look up an id outside u32 (the ingress decodes prompts for the
# detokenizer's context); the engine checks ids against the model's vocabulary.
TokenId = Annotated[int, Field(ge=0, lt=2**32)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False
    continuous_usage_stats: bool = False
    """vLLM's: with ``include_usage``, every chunk carries the usage so far."""


class StreamUsage(NamedTuple):
    """Where a stream reports usage: in a last chunk of its own, and in every chunk as it goes."""

    final: bool
    continuous: bool


class JsonSchema(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=64)
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]


class JsonObjectFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["json_object"]


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["json_schema"]
    json_schema: JsonSchema


OutputFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")]


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    response_format: OutputFormat | None = None

    @property
    def structured_param(self) -> str:
        """The field the request's output constraint came from, for errors."""
        return "structured_outputs" if self.response_format is None or isinstance(self.response_format, TextFormat) else "response_format"

    @property
    def asked_prompt_logprobs(self) -> int | None:
        """vLLM's ``prompt_logprobs`` as the client gave it (checked when the sampling parameters are built)."""
        return (self.model_extra or {}).get("prompt_logprobs")

    def _check_scoring(self, max_tokens: int | None, echo: bool) -> None:
        """``prompt_logprobs`` comes whole, never streamed (as in vLLM); ``max_tokens`` 0 only scores a prompt."""
        if self.stream and self.asked_prompt_logprobs is not None:
            raise APIError(400, "prompt_logprobs is not available with stream (as in vLLM)", param="prompt_logprobs")
        if max_tokens == 0 and not echo and self.asked_prompt_logprobs is None:
            raise APIError(400, "max_tokens: 0 generates nothing; it is for scoring a prompt with echo or prompt_logprobs", param="max_tokens")

    @property
    def stream_usage(self) -> StreamUsage:
        """As vLLM: ``continuous_usage_stats`` counts only with ``include_usage``."""
        options = self.stream_options or StreamOptions()
        return StreamUsage(options.include_usage, options.include_usage and options.continuous_usage_stats)

    def _structured_outputs(self) -> StructuredOutputs | None:
        """``response_format`` as `StructuredOutputs` (None: text, or not given)."""
        if isinstance(self.response_format, JsonObjectFormat):
            return StructuredOutputs(json_object=True)
        if isinstance(self.response_format, JsonSchemaFormat):
            return StructuredOutputs(json=self.response_format.json_schema.schema_)
        return None

    def _sampling_params(self, keep_none: tuple[str, ...] = (), **fields: Any) -> SamplingParams:
        """The request's sampling parameters: ``fields`` (those None left to SamplingParams' defaults, but ``keep_none``) and its extras."""
        structured = self._structured_outputs()
        if structured is not None and "structured_outputs" in (self.model_extra or {}):
            raise APIError(400, "give response_format or structured_outputs, not both", param="response_format")
        fields["structured_outputs"] = structured
        try:
            return SamplingParams(**(self.model_extra or {}), **{k: v for k, v in fields.items() if v is not None or k in keep_none})
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
            raise APIError(400, "best_of other than n is not supported (nor in vLLM): ask for n choices and rank them", param="best_of")
        return self

    @property
    def echo_logprobs(self) -> int | None:
        """With echo, the prompt tokens' logprobs come first in ``logprobs``, with this many alternatives."""
        return self.logprobs if self.echo else None

    def sampling_params(self) -> SamplingParams:
        """With echo and logprobs, the engine scores the prompt with the larger of the two top-N counts."""
        self._check_scoring(self.max_tokens, self.echo)
        params = self._sampling_params(max_tokens=self.max_tokens, logprobs=self.logprobs)
        if self.echo_logprobs is not None:
            params = params.model_copy(update={"prompt_logprobs": max(params.prompt_logprobs or 0, self.echo_logprobs)})
        return params

    def prompts(self) -> list[str | list[int]]:
        """The prompts, each text or token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if all(isinstance(p, int) for p in prompt):
            return [prompt]  # type: ignore[list-item]
        return list(prompt)  # type: ignore[arg-type]


class ChatCompletionRequest(_Request, ChatPrompt):
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True

    @model_validator(mode="after")
    def _check_tools(self) -> ChatCompletionRequest:
        names = [tool.function.name for tool in self.tools or []]
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

    @property
    def offered_tools(self) -> list[Tool] | None:
        """The tools the model is offered: none with tool_choice "none"."""
        return self.tools if self.effective_tool_choice != "none" else None

    def sampling_params(self, default_max_tokens: int | None = None) -> SamplingParams:
        """``default_max_tokens`` (the operator's) bounds a chat that sets neither ``max_tokens`` nor
        ``max_completion_tokens``; None: until the context is full (vLLM's behaviour)."""
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(400, "top_logprobs requires logprobs to be true", param="top_logprobs")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        self._check_scoring(max_tokens, echo=False)
        if max_tokens is None and default_max_tokens is not None:
            min_tokens = (self.model_extra or {}).get("min_tokens", 0)
            max_tokens = max(default_max_tokens, min_tokens) if isinstance(min_tokens, int) else default_max_tokens
        return self._sampling_params(keep_none=("max_tokens",), logprobs=logprobs, max_tokens=max_tokens)
