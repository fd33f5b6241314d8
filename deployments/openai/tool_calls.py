"""How a chat request's ``tool_choice`` shapes its output: which parser reads each choice's
text into calls, and, for "required" or a named function, the JSON schema the output is
constrained to.

- "none" (the default without tools): the tools are not offered and the text is not parsed;
- "auto" (the default with tools): the configured parser (``tool_call_parser``) finds the
  calls the model writes among its text;
- "required" / a named function: the grammar constrains the output to the calls' JSON
  (`deployments.openai.tools.required_calls_schema` / the function's parameters), read back
  by `deployments.openai.constrained_calls` as it streams; such a call always comes back as a
  call, cut short or not.

A choice that made calls and stopped by itself finishes with ``"tool_calls"``; one cut short
keeps its reason (``"length"``). With ``parallel_tool_calls`` false only its first call is kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deployments.openai.constrained_calls import NamedCallParser, RequiredCallsParser
from deployments.openai.errors import APIError
from deployments.openai.protocol import ChatCompletionRequest
from deployments.openai.tool_parsers import TOOL_CALL_PARSERS, CallFragment, ToolCallParser
from deployments.openai.tools import NamedToolChoice, ToolCall, ToolCallDelta, parameters_schema, required_calls_schema
from sampling.params import SamplingParams
from sampling.structured_outputs import json_schema_output


@dataclass(frozen=True)
class ToolCallOutput:
    """How each choice of one request is read for tool calls."""

    parser_name: str | None  # None: constrained output (`deployments.openai.constrained_calls`)
    function_names: frozenset[str]
    named_function: str | None
    parallel_tool_calls: bool
    max_call_bytes: int

    def new_parser(self) -> ToolCallParser:
        if self.named_function is not None:
            return NamedCallParser(self.named_function)
        if self.parser_name is None:
            return RequiredCallsParser(self.function_names)
        return TOOL_CALL_PARSERS[self.parser_name](self.function_names, self.max_call_bytes)


def tool_call_output(body: ChatCompletionRequest, parser_name: str, max_call_bytes: int) -> ToolCallOutput | None:
    """None when the request offers no tools to call."""
    choice, tools = body.effective_tool_choice, body.offered_tools
    if not tools:
        return None
    names = frozenset(tool.function.name for tool in tools)
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    parser = parser_name if choice == "auto" else None
    return ToolCallOutput(parser, names, named, body.parallel_tool_calls, max_call_bytes)


def tool_call_schema(body: ChatCompletionRequest) -> dict[str, Any] | None:
    """The JSON schema "required" or a named function constrains the output to; None otherwise."""
    choice, tools = body.effective_tool_choice, body.tools or []
    if isinstance(choice, NamedToolChoice):
        return parameters_schema(next(t.function for t in tools if t.function.name == choice.function.name))
    if choice == "required":
        return required_calls_schema(tools, body.parallel_tool_calls)
    return None


def constrain_to_json_schema(params: SamplingParams, schema: dict[str, Any]) -> SamplingParams:
    """``params`` with the output constrained to ``schema`` (structured outputs, `sampling.structured_outputs`);
    a 400 if the request constrains its output already."""
    if params.structured_outputs is not None:
        raise APIError(400, "tool_choice 'required' or a named function cannot be combined with response_format or structured_outputs", param="tool_choice")
    return params.model_copy(update={"structured_outputs": json_schema_output(schema)})


class ChoiceToolCalls:
    """One choice's calls so far, read from its text deltas in order."""

    def __init__(self, output: ToolCallOutput) -> None:
        self.parser = output.new_parser()
        self.max_calls = None if output.parallel_tool_calls else 1
        self.calls: list[ToolCall] = []

    def feed(self, text: str, finished: bool) -> tuple[str, list[ToolCallDelta]]:
        """The delta's text that is not a call, and the pieces of calls in it (`ToolCallDelta`)."""
        parsed = self.parser.feed(text)
        if finished:
            parsed += self.parser.finish()
        kept = [fragment for fragment in parsed.calls if self.max_calls is None or fragment.index < self.max_calls]
        return parsed.content, [self._add(fragment) for fragment in kept]

    def _add(self, fragment: CallFragment) -> ToolCallDelta:
        if fragment.name is not None:
            self.calls.append(ToolCall.new(fragment.name, fragment.arguments))
            return ToolCallDelta.opening(fragment.index, self.calls[-1])
        self.calls[fragment.index].function.arguments += fragment.arguments
        return ToolCallDelta.more_arguments(fragment.index, fragment.arguments)

    def finish_reason(self, reason: str | None) -> str | None:
        return "tool_calls" if self.calls and reason == "stop" else reason
