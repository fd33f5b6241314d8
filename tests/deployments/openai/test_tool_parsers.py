"""The ``hermes`` tool-call parser: the same content and calls whatever the split of the text into
deltas, ordinary text held back only while it may still start a tag, a bounded buffer, and
hostile output (a list as the name, a huge integer, deep nesting, arbitrary text) read as text,
never an exception."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from deployments.openai.tool_parsers import CallFragment, HermesToolParser, ParsedText, held_back

NAMES = frozenset({"get_weather", "add"})
MAX_CALL_BYTES = 64  # some of the generated calls are longer
START, END = HermesToolParser.START, HermesToolParser.END


def parse(deltas: list[str], max_call_bytes: int = MAX_CALL_BYTES) -> ParsedText:
    parser = HermesToolParser(NAMES, max_call_bytes)
    parsed = ParsedText()
    for delta in deltas:
        parsed += parser.feed(delta)
    parsed += parser.finish()
    return parsed


def reference(text: str) -> ParsedText:
    """The whole text at once, by a regular expression: closed blocks of known calls are calls."""
    parsed = ParsedText()
    position = 0
    for match in re.finditer(re.escape(START) + "(.*?)" + re.escape(END), text, flags=re.DOTALL):
        parsed.content += text[position : match.start()]
        position = match.end()
        try:
            value = json.loads(match.group(1))
        except json.JSONDecodeError:
            value = None
        if isinstance(value, dict) and value.get("name") in NAMES and len(match.group(1).encode()) <= MAX_CALL_BYTES:
            parsed.calls.append(CallFragment(len(parsed.calls), value["name"], json.dumps(value.get("arguments", {}), ensure_ascii=False)))
        else:
            parsed.content += match.group(0)
    parsed.content += text[position:]
    return parsed


def splits(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(points, points[1:])]


CALLS = st.builds(
    lambda name, city, spaces: f"{START}{spaces}{json.dumps({'name': name, 'arguments': {'city': city}})}{spaces}{END}",
    st.sampled_from(["get_weather", "add", "unknown"]),
    st.text(max_size=24),
    st.sampled_from(["", "\n", " "]),
)
NOISE = st.sampled_from(["<", "<tool", "<tool_call", "</tool_call>", "<tool_response>", "a < b", "{", "}", "é", "\n"])
OUTPUTS = st.lists(st.one_of(st.text(max_size=12), CALLS, NOISE, st.just(START + "{not json" + END)), max_size=8).map("".join)


@given(OUTPUTS, st.lists(st.integers(0, 200), max_size=12))
def test_any_split_parses_as_the_whole_text(text: str, cuts: list[int]):
    assert parse(splits(text, cuts)) == reference(text)


@given(OUTPUTS, st.lists(st.integers(0, 200), max_size=12))
def test_text_is_held_back_only_while_it_may_start_a_tag(text: str, cuts: list[int]):
    parser = HermesToolParser(NAMES, MAX_CALL_BYTES)
    fed = ""
    for delta in splits(text, cuts):
        parser.feed(delta)
        fed += delta
        if not parser.in_call:
            assert parser.pending == fed[len(fed) - len(parser.pending) :]
            assert len(parser.pending) == held_back(fed, START)


def test_text_calls_and_text():
    text = f'Let me look.\n{START}\n{{"name": "get_weather", "arguments": {{"city": "Paris"}}}}\n{END}\nDone.'
    assert parse([text]) == ParsedText("Let me look.\n\nDone.", [CallFragment(0, "get_weather", '{"city": "Paris"}')])


def test_arguments_given_as_text_and_as_parameters():
    strings = f'{START}{{"name": "add", "arguments": "{{\\"a\\": 1}}"}}{END}{START}{{"name": "add", "parameters": {{"a": 2}}}}{END}'
    assert parse([strings]).calls == [CallFragment(0, "add", '{"a": 1}'), CallFragment(1, "add", '{"a": 2}')]


def test_a_call_longer_than_the_limit_is_text_and_the_buffer_stays_bounded():
    body = '{"name": "add", "arguments": {"a": "' + "x" * 1000 + '"}}'
    parser = HermesToolParser(NAMES, max_call_bytes=64)
    parsed = ParsedText()
    for char in START + body + END + " after":
        parsed += parser.feed(char)
        assert len(parser.pending.encode()) < 64 + len(END)
    parsed += parser.finish()
    assert parsed == ParsedText(START + body + END + " after")


def test_an_unclosed_call_is_text_at_the_end():
    assert parse([START, '{"name": "add"']) == ParsedText(START + '{"name": "add"')


HOSTILE_BODIES = [
    '{"name": ["get_weather"], "arguments": {}}',
    '{"name": {"a": 1}, "arguments": {}}',
    '{"name": "add", "arguments": {"a": ' + "9" * 5000 + "}}",
    '{"name": "add", "arguments": {"a": 1e999}}',
    '{"name": "add", "arguments": {"a": NaN}}',
    '{"name": "add", "arguments": ' + "[" * 5000 + "]" * 5000 + "}",
    '{"name": "add", "arguments": {"a": ' + "[" * 900 + "]" * 900 + "}}",
    "[" * 5000 + "]" * 5000,
    '"just a string"',
    "null",
]


@pytest.mark.parametrize("body", HOSTILE_BODIES, ids=range(len(HOSTILE_BODIES)))
def test_a_call_the_parser_cannot_read_is_text(body: str):
    parsed = parse([f"ok {START}{body}{END} done"], max_call_bytes=1 << 20)
    for call in parsed.calls:  # what reads as a call (nesting under the recursion limit) has JSON arguments
        json.loads(call.arguments)
    if not parsed.calls:
        assert parsed.content == f"ok {START}{body}{END} done"


JSON_ISH = st.text(alphabet=st.sampled_from(list('{}[]",:0123456789.eE+-\\ntrufalsNIy ')) | st.characters(), max_size=80)
HOSTILE_OUTPUTS = st.lists(st.one_of(JSON_ISH, st.sampled_from([START, END, '"name"', '"get_weather"', '"arguments"']), NOISE), max_size=10).map("".join)


@example(START + "\ud800", [])  # a lone surrogate: the byte counts raised once
@given(HOSTILE_OUTPUTS, st.lists(st.integers(0, 300), max_size=12))
def test_no_output_makes_the_parser_raise(text: str, cuts: list[int]):
    parsed = parse(splits(text, cuts), max_call_bytes=256)
    assert parsed == parse([text], max_call_bytes=256)
    for call in parsed.calls:
        assert call.name in NAMES
