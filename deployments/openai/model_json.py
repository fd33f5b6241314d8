"""JSON the model wrote, read without trusting it: any text either reads or does not, nothing raises.

`json.loads` raises more than `json.JSONDecodeError` on hostile text (``ValueError`` for an
integer past Python's digit limit, ``RecursionError`` for deep nesting), and `json.dumps`
writes ``Infinity`` for ``1e999``, which is not JSON. `read_json` and `write_json` turn
all of these into "not readable".

`ValueEnd` finds where one JSON value ends in text fed piece by piece, by its strings,
escapes and brackets alone, so a value can be let through as it is generated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

WHITESPACE = " \t\n\r"
SCALAR_END = ",]}" + WHITESPACE


@dataclass(frozen=True)
class JsonValue:
    """A value read from text (a wrapper, since ``null`` is a value too)."""

    value: object


def read_json(text: str) -> JsonValue | None:
    """The JSON value ``text`` holds, or None when it is not JSON Python can read."""
    try:
        return JsonValue(json.loads(text))
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError, as is an integer past the digit limit
        return None


def write_json(value: object) -> str | None:
    """``value`` as JSON text, or None when it has no JSON form (NaN, infinities, nesting past the recursion limit)."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (ValueError, RecursionError):
        return None


class ValueEnd:
    """Where one JSON value ends, fed its text piece by piece from its first character (no whitespace before it).

    A string ends at its closing quote, an object or array when its brackets balance, a number
    or literal before the first character that cannot continue it. It checks nothing else: on
    text that is not JSON it still answers, never raises.
    """

    def __init__(self) -> None:
        self.started = False
        self.scalar = False
        self.depth = 0
        self.in_string = False
        self.escaped = False

    def feed(self, text: str) -> int | None:
        """How many characters of ``text`` are still the value's, when it ends in ``text``; None when it goes on."""
        for index, char in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif char == "\\":
                    self.escaped = True
                elif char == '"':
                    self.in_string = False
                    if self.depth == 0:
                        return index + 1
            elif self.scalar or (not self.started and char in SCALAR_END):
                if char in SCALAR_END:
                    return index
            elif char == '"':
                self.in_string = True
            elif char in "[{":
                self.depth += 1
            elif char in "]}":
                self.depth -= 1
                if self.depth <= 0:
                    return index + 1
            elif self.depth == 0:
                self.scalar = True
            self.started = True
        return None
