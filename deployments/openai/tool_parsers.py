"""Tool calls found in a choice's text as it streams, by parsers chosen by name (``tool_call_parser``).

A parser is fed the choice's text deltas however the text was split, and returns the
ordinary text it can already let through and the calls it has completed. It holds back
only what it must: the tail that may still turn out to be the start of a call's tag, and
a call's body until the call closes; a body longer than ``max_call_bytes`` is let through
as text, so what a parser buffers is bounded.

``hermes`` (`HermesToolParser`): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
the format of Hermes, Qwen 2.5 and 3, and of Spout's generic fallback prompt.

`ConstrainedCallsParser` reads the output of ``tool_choice`` "required" or a named function,
which the grammar makes the call(s) JSON itself (`deployments.openai.tools`' schemas).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ParsedCall:
    """A completed call: the function's name and its arguments as JSON text."""

    name: str
    arguments: str


@dataclass
class ParsedText:
    """What a feed lets through: ordinary text, and the calls completed in it."""

    content: str = ""
    calls: list[ParsedCall] = field(default_factory=list)

    def __iadd__(self, other: ParsedText) -> ParsedText:
        self.content += other.content
        self.calls += other.calls
        return self


class ToolCallParser(ABC):
    """Incremental: `feed` every delta, then `finish` once at the end of the choice."""

    def __init__(self, function_names: frozenset[str], max_call_bytes: int) -> None:
        self.function_names = function_names
        self.max_call_bytes = max_call_bytes

    @abstractmethod
    def feed(self, text: str) -> ParsedText: ...

    @abstractmethod
    def finish(self) -> ParsedText:
        """The end of the output: what is still held back goes out as text (a call never closed is text)."""


def held_back(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` may be the start of ``tag``."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


def parsed_call(name: str, arguments: object) -> ParsedCall:
    """A call whose arguments are JSON text as they are, or JSON values to write as text."""
    return ParsedCall(name, arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False))


class HermesToolParser(ToolCallParser):
    START, END = "<tool_call>", "</tool_call>"

    def __init__(self, function_names: frozenset[str], max_call_bytes: int) -> None:
        super().__init__(function_names, max_call_bytes)
        self.pending = ""  # text not yet let through: a possible start tag, or a call's body
        self.in_call = False

    def feed(self, text: str) -> ParsedText:
        parsed = ParsedText()
        searched = max(0, len(self.pending) - len(self.END) + 1)  # the part of pending already searched
        self.pending += text
        while True:
            if self.in_call:
                end = self.pending.find(self.END, searched)
                if end < 0:
                    # Over the limit even if the end tag has begun: not a call we keep, it is text.
                    if len(self.pending.encode()) >= self.max_call_bytes + len(self.END):
                        parsed.content += self.START + self.pending
                        self.pending, self.in_call = "", False
                    return parsed
                parsed += self._close(self.pending[:end])
                self.pending, self.in_call = self.pending[end + len(self.END) :], False
            else:
                start = self.pending.find(self.START)
                if start < 0:
                    keep = held_back(self.pending, self.START)
                    parsed.content += self.pending[: len(self.pending) - keep]
                    self.pending = self.pending[len(self.pending) - keep :]
                    return parsed
                parsed.content += self.pending[:start]
                self.pending, self.in_call = self.pending[start + len(self.START) :], True
            searched = 0

    def finish(self) -> ParsedText:
        content = (self.START if self.in_call else "") + self.pending
        self.pending, self.in_call = "", False
        return ParsedText(content)

    def _close(self, body: str) -> ParsedText:
        """A closed call's body: the call, or the text as the model wrote it when it is not a call of a known function."""
        call = self._call(body) if len(body.encode()) <= self.max_call_bytes else None
        return ParsedText(calls=[call]) if call is not None else ParsedText(self.START + body + self.END)

    def _call(self, body: str) -> ParsedCall | None:
        try:
            value = json.loads(body)
        except json.JSONDecodeError:
            return None
        if not isinstance(value, dict) or value.get("name") not in self.function_names:
            return None
        return parsed_call(value["name"], value.get("arguments", value.get("parameters", {})))


class ConstrainedCallsParser(ToolCallParser):
    """The whole output is the calls: with ``named_function``, its arguments object; without,
    a JSON array of ``{"name", "arguments"}``. It is held until the end; an output that is not
    such JSON (cut short by the length limit) or longer than ``max_call_bytes`` is text."""

    def __init__(self, function_names: frozenset[str], max_call_bytes: int, named_function: str | None) -> None:
        super().__init__(function_names, max_call_bytes)
        self.named_function = named_function
        self.pending = ""
        self.passing = False  # over the limit: the output is let through as text

    def feed(self, text: str) -> ParsedText:
        if self.passing:
            return ParsedText(text)
        self.pending += text
        if len(self.pending.encode()) <= self.max_call_bytes:
            return ParsedText()
        self.passing, pending, self.pending = True, self.pending, ""
        return ParsedText(pending)

    def finish(self) -> ParsedText:
        pending, self.pending = self.pending, ""
        calls = self._calls(pending)
        return ParsedText(calls=calls) if calls else ParsedText(pending)

    def _calls(self, text: str) -> list[ParsedCall]:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return []
        if self.named_function is not None:
            return [parsed_call(self.named_function, value)] if isinstance(value, dict) else []
        if not isinstance(value, list) or not all(isinstance(c, dict) and c.get("name") in self.function_names for c in value):
            return []
        return [parsed_call(c["name"], c.get("arguments", {})) for c in value]


TOOL_CALL_PARSERS: dict[str, type[ToolCallParser]] = {"hermes": HermesToolParser}
"""Parsers by the name the ``tool_call_parser`` option takes."""
