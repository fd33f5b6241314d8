"""Tool calls found in a choice's text as it streams, by parsers chosen by name (``tool_call_parser``).

A parser is fed the choice's text deltas however the text was split, and returns the
ordinary text it can already let through and the pieces of calls (`CallFragment`) found in
it. Whatever the model wrote, a parser never raises: text it cannot read as a call is text.

``hermes`` (`HermesToolParser`): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
the format of Hermes, Qwen 2.5 and 3, and of Spout's generic fallback prompt. The model writes
it freely, so a call is only known to be one when its block closes: the parser holds back the
tail that may still start a tag, and a call's body until the call closes, then lets the call
through in one piece. A body longer than ``max_call_bytes`` is let through as text, so what
it buffers is bounded.

The output of ``tool_choice`` "required" or a named function, which the grammar makes the
calls' JSON itself, is read by `deployments.openai.constrained_calls`, argument by argument
as it is generated.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from deployments.openai.model_json import read_json, write_json


@dataclass(frozen=True)
class CallFragment:
    """A piece of the choice's call number ``index``: the first piece of a call has its name, the
    others None; the pieces' ``arguments`` concatenate to the call's arguments (JSON text)."""

    index: int
    name: str | None
    arguments: str


@dataclass
class ParsedText:
    """What a feed lets through: ordinary text, and the pieces of calls in it, at most one per call."""

    content: str = ""
    calls: list[CallFragment] = field(default_factory=list)

    def __iadd__(self, other: ParsedText) -> ParsedText:
        self.content += other.content
        for fragment in other.calls:
            self.add(fragment)
        return self

    def add(self, fragment: CallFragment) -> None:
        """Append ``fragment``, joined to the piece of the same call before it."""
        last = self.calls[-1] if self.calls else None
        if last is not None and last.index == fragment.index and fragment.name is None:
            self.calls[-1] = CallFragment(last.index, last.name, last.arguments + fragment.arguments)
        elif fragment.name is not None or fragment.arguments:
            self.calls.append(fragment)


class ToolCallParser(ABC):
    """Incremental: `feed` every delta, then `finish` once at the end of the choice."""

    @abstractmethod
    def feed(self, text: str) -> ParsedText: ...

    @abstractmethod
    def finish(self) -> ParsedText:
        """The end of the output: what is still held back goes out (a call never closed is text)."""


def held_back(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` may be the start of ``tag``."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


class HermesToolParser(ToolCallParser):
    START, END = "<tool_call>", "</tool_call>"

    def __init__(self, function_names: frozenset[str], max_call_bytes: int) -> None:
        self.function_names = function_names
        self.max_call_bytes = max_call_bytes
        self.pending = ""  # text not yet let through: a possible start tag, or a call's body
        self.in_call = False
        self.num_calls = 0

    def feed(self, text: str) -> ParsedText:
        parsed = ParsedText()
        searched = max(0, len(self.pending) - len(self.END) + 1)  # the part of pending already searched
        self.pending += text
        while True:
            if self.in_call:
                end = self.pending.find(self.END, searched)
                if end < 0:
                    # Over the limit even if the end tag has begun: not a call we keep, it is text
                    # (but for a tail that may start the next call).
                    if len(self.pending.encode(errors="surrogatepass")) >= self.max_call_bytes + len(self.END):
                        keep = held_back(self.pending, self.START)
                        parsed.content += self.START + self.pending[: len(self.pending) - keep]
                        self.pending, self.in_call = self.pending[len(self.pending) - keep :], False
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
        call = self._call(body) if len(body.encode(errors="surrogatepass")) <= self.max_call_bytes else None
        if call is None:
            return ParsedText(self.START + body + self.END)
        self.num_calls += 1
        return ParsedText(calls=[call])

    def _call(self, body: str) -> CallFragment | None:
        read = read_json(body)
        value = read.value if read is not None else None
        if not isinstance(value, dict):
            return None
        name = value.get("name")
        if not isinstance(name, str) or name not in self.function_names:
            return None
        arguments = value.get("arguments", value.get("parameters", {}))
        text = arguments if isinstance(arguments, str) else write_json(arguments)
        return None if text is None else CallFragment(self.num_calls, name, text)


TOOL_CALL_PARSERS: dict[str, type[HermesToolParser]] = {"hermes": HermesToolParser}
"""Parsers of the model's own calls (``tool_choice`` "auto"), by the name the ``tool_call_parser`` option takes."""
