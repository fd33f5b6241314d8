"""How a chat request's ``tool_choice`` shapes its output: which parser reads each choice's
text into calls, and, for "required" or a named function, the JSON schema the output is
constrained to.

- "none" (the default without tools): the tools are not offered and the text is not parsed;
- "auto" (the default with tools): the configured parser (``tool_call_parser``) finds the
  calls the model writes among its text;
- "required" / a named function: the grammar constrains the output to the calls' JSON
  (`deployments.openai.tools.required_calls_schema` / the function's parameters), read back
  by `ConstrainedCallsParser`.

A choice that made calls and stopped by itself finishes with ``"tool_calls"``; with
``parallel_tool_calls`` false only its first call is kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deployments.openai.errors import APIError
from deployments.openai.protocol import ChatCompletionRequest
from deployments.openai.tool_parsers import TOOL_CALL_PARSERS, ConstrainedCallsParser, ToolCallParser
from deployments.openai.tools import NamedToolChoice, ToolCall, parameters_schema, required_calls_schema
from sampling.params import SamplingParams


@dataclass(frozen=True)
class ToolCallOutput:
    """How each choice of one request is read for tool calls."""

    parser_name: str | None  # None: constrained output (`ConstrainedCallsParser`)
    function_names: frozenset[str]
    named_function: str | None
    parallel_tool_calls: bool
    max_call_bytes: int

    def new_parser(self) -> ToolCallParser:
        if self.parser_name is None:
            return ConstrainedCallsParser(self.function_names, self.max_call_bytes, self.named_function)
        return TOOL_CALL_PARSERS[self.parser_name](self.function_names, self.max_call_bytes)


def tool_call_output(body: ChatCompletionRequest, parser_name: str, max_call_bytes: int) -> ToolCallOutput | None:
    """None when the request offers no tools to call."""
    choice = body.effective_tool_choice
    if choice == "none" or not body.tools:
        return None
    names = frozenset(tool.function.name for tool in body.tools)
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
    """``params`` with the output constrained to ``schema``: the grammar engine's entry point
    (structured outputs), which this branch does not have yet."""
    raise APIError(400, "tool_choice 'required' or a named function: constrained decoding is not supported yet", param="tool_choice")


class ChoiceToolCalls:
    """One choice's calls so far, read from its text deltas in order."""

    def __init__(self, output: ToolCallOutput) -> None:
        self.parser = output.new_parser()
        self.parallel_tool_calls = output.parallel_tool_calls
        self.calls: list[ToolCall] = []

    def feed(self, text: str, finished: bool) -> tuple[str, list[tuple[int, ToolCall]]]:
        """The delta's text that is not a call, and its new calls with their indexes among the choice's calls."""
        parsed = self.parser.feed(text)
        if finished:
            parsed += self.parser.finish()
        new = [ToolCall.new(call.name, call.arguments) for call in parsed.calls]
        if not self.parallel_tool_calls:
            new = new[: max(0, 1 - len(self.calls))]
        first = len(self.calls)
        self.calls += new
        return parsed.content, list(enumerate(new, start=first))

    def finish_reason(self, reason: str | None) -> str | None:
        return "tool_calls" if self.calls and reason == "stop" else reason
