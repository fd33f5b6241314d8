"""Tool-call parsers: the same content and calls whatever the split of the text into deltas,
ordinary text held back only while it may still start a tag, and a bounded buffer."""

from __future__ import annotations

import json
import re

from hypothesis import given
from hypothesis import strategies as st

from deployments.openai.tool_parsers import ConstrainedCallsParser, HermesToolParser, ParsedCall, ParsedText, held_back

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
            parsed.calls.append(ParsedCall(value["name"], json.dumps(value.get("arguments", {}), ensure_ascii=False)))
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
    assert parse([text]) == ParsedText("Let me look.\n\nDone.", [ParsedCall("get_weather", '{"city": "Paris"}')])


def test_arguments_given_as_text_and_as_parameters():
    strings = f'{START}{{"name": "add", "arguments": "{{\\"a\\": 1}}"}}{END}{START}{{"name": "add", "parameters": {{"a": 2}}}}{END}'
    assert parse([strings]).calls == [ParsedCall("add", '{"a": 1}'), ParsedCall("add", '{"a": 2}')]


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


def test_named_function_output_is_its_arguments():
    parser = ConstrainedCallsParser(NAMES, MAX_CALL_BYTES, named_function="get_weather")
    assert parser.feed('{"city":') == ParsedText()
    assert parser.feed(' "Oslo"}') == ParsedText()
    assert parser.finish() == ParsedText(calls=[ParsedCall("get_weather", '{"city": "Oslo"}')])


def test_required_output_is_an_array_of_calls():
    parser = ConstrainedCallsParser(NAMES, 256, named_function=None)
    parser.feed('[{"name": "add", "arguments": {"a": 1}}, {"name": "get_weather", "arguments": {}}]')
    assert parser.finish().calls == [ParsedCall("add", '{"a": 1}'), ParsedCall("get_weather", "{}")]


def test_constrained_output_that_is_no_call_is_text():
    for named, text in [(None, '[{"name": "nope", "arguments": {}}]'), (None, '[{"name": "add"'), ("add", "[1]")]:
        parser = ConstrainedCallsParser(NAMES, MAX_CALL_BYTES, named_function=named)
        parser.feed(text)
        assert parser.finish() == ParsedText(text)


def test_constrained_output_over_the_limit_passes_as_text():
    parser = ConstrainedCallsParser(NAMES, max_call_bytes=8, named_function="add")
    assert parser.feed('{"a": ') == ParsedText()
    assert parser.feed('"long"}') == ParsedText('{"a": "long"}')
    assert parser.feed(" more") == ParsedText(" more")
    assert parser.finish() == ParsedText()
