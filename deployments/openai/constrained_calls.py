"""The output of ``tool_choice`` "required" or a named function, read as calls while it streams.

The grammar makes this output the calls' JSON itself, written compactly (`engine.grammar.spec`),
so each call's arguments go out piece by piece as they are generated (vLLM's behaviour), and
a call cut short by ``max_tokens`` is still a call: its arguments are what was generated, and
the choice's ``finish_reason`` ("length") says why they end there.

- a named function (`NamedCallParser`): the whole output is its arguments;
- "required" (`RequiredCallsParser`): ``[{"name": <function>, "arguments": <value>}, ...]``,
  a call known once its name is complete (the schema lists ``name`` before ``arguments``, and
  llguidance writes properties in the schema's order).

Neither raises on any text: output that is not of this shape (which the grammar rules out)
goes out as text from where it stops being calls.
"""

from __future__ import annotations

import re
from enum import Enum

from deployments.openai.model_json import WHITESPACE, ValueEnd, read_json
from deployments.openai.tool_parsers import CallFragment, ParsedText, ToolCallParser

MAX_HEAD_BYTES = 1024
"""What `RequiredCallsParser` holds back between two calls' arguments: the JSON around a function
name of at most 64 characters (compact, it takes under 100 bytes). Past this it is text."""


class NamedCallParser(ToolCallParser):
    """The output is the named function's arguments: let through as they come, whitespace
    around them left out. The call exists even if nothing was generated (its arguments are then empty)."""

    def __init__(self, function_name: str) -> None:
        self.function_name = function_name
        self.opened = False
        self.trailing = ""  # whitespace not let through: it ends the arguments unless more follows

    def feed(self, text: str) -> ParsedText:
        text = self.trailing + text if self.opened else text.lstrip(WHITESPACE)
        arguments = text.rstrip(WHITESPACE)
        self.trailing = text[len(arguments) :]
        if not arguments:
            return ParsedText()
        fragment = CallFragment(0, None if self.opened else self.function_name, arguments)
        self.opened = True
        return ParsedText(calls=[fragment])

    def finish(self) -> ParsedText:
        return ParsedText() if self.opened else ParsedText(calls=[CallFragment(0, self.function_name, "")])


class Reading(Enum):
    HEAD = "head"  # the JSON before a call's arguments (or after the last call's)
    ARGUMENTS = "arguments"
    DONE = "done"  # the array has closed
    TEXT = "text"  # not the calls' JSON: the rest is text


def call_head(opening: str) -> re.Pattern[str]:
    """The JSON from ``opening`` to the first character of a call's arguments; group 1 is its name (a JSON string)."""
    return re.compile(rf'\s*{opening}\s*\{{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(?=\S)')


FIRST_CALL, NEXT_CALL = call_head(r"\["), call_head(r"\}\s*,")
ARRAY_END = re.compile(r"\s*\}\s*\]")


class RequiredCallsParser(ToolCallParser):
    """``[{"name": ..., "arguments": ...}, ...]``: each call goes out with its name once the name
    is complete, then its arguments piece by piece. At the end, the JSON of a next call cut
    off before its name is complete is left out; an output cut before any call is text."""

    def __init__(self, function_names: frozenset[str]) -> None:
        self.function_names = function_names
        self.reading = Reading.HEAD
        self.held = ""
        self.arguments = ValueEnd()
        self.num_calls = 0

    def feed(self, text: str) -> ParsedText:
        parsed = ParsedText()
        while text:
            if self.reading is Reading.ARGUMENTS:
                end = self.arguments.feed(text)
                parsed.add(CallFragment(self.num_calls - 1, None, text if end is None else text[:end]))
                text = "" if end is None else text[end:]
                self.reading = Reading.ARGUMENTS if end is None else Reading.HEAD
            elif self.reading is Reading.HEAD:
                self.held += text
                text = self._read_head(parsed)
            else:
                parsed.content += text if self.reading is Reading.TEXT or text.strip(WHITESPACE) else ""
                text = ""
        return parsed

    def finish(self) -> ParsedText:
        held, self.held = self.held, ""
        return ParsedText(held if self.reading is Reading.HEAD and self.num_calls == 0 else "")

    def _read_head(self, parsed: ParsedText) -> str:
        """Read what is held as far as it goes; the text after the head of a call (its arguments' start)."""
        head = (NEXT_CALL if self.num_calls else FIRST_CALL).match(self.held)
        if head is not None:
            return self._open_call(head, parsed)
        end = ARRAY_END.match(self.held) if self.num_calls else None
        if end is not None:
            self.reading, rest, self.held = Reading.DONE, self.held[end.end() :], ""
            return rest
        if len(self.held.encode(errors="surrogatepass")) > MAX_HEAD_BYTES:
            self.reading, rest, self.held = Reading.TEXT, self.held, ""
            return rest
        return ""

    def _open_call(self, head: re.Match[str], parsed: ParsedText) -> str:
        read = read_json(head.group(1))
        name = read.value if read is not None else None
        if not isinstance(name, str) or name not in self.function_names:
            self.reading, rest, self.held = Reading.TEXT, self.held, ""
            return rest
        parsed.add(CallFragment(self.num_calls, name, ""))
        self.num_calls += 1
        self.reading, self.arguments = Reading.ARGUMENTS, ValueEnd()
        rest, self.held = self.held[head.end() :], ""
        return rest
