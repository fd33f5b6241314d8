"""Reading the output of a required or named tool call as it streams: the pieces of each call's
arguments concatenate to the arguments generated, whatever the split; a call cut short by the
length limit is still a call; no text makes a parser raise."""

from __future__ import annotations

import json

from hypothesis import example, given
from hypothesis import strategies as st

from deployments.openai.constrained_calls import MAX_HEAD_BYTES, NamedCallParser, RequiredCallsParser
from deployments.openai.tool_parsers import CallFragment, ParsedText, ToolCallParser
from tests.deployments.openai.test_tool_parsers import HOSTILE_OUTPUTS, splits

NAMES = frozenset({"get_weather", "add"})
ARGUMENTS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)
CALLS = st.lists(st.tuples(st.sampled_from(sorted(NAMES)), st.dictionaries(st.text(max_size=6), ARGUMENTS, max_size=4)), min_size=1, max_size=3)


def compact(value: object) -> str:
    """JSON as the grammar writes it (no whitespace between tokens)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def feed_all(parser: ToolCallParser, deltas: list[str]) -> tuple[ParsedText, list[ParsedText]]:
    """Everything the parser let through, joined, and per feed (the finish last)."""
    per_feed = [parser.feed(delta) for delta in deltas] + [parser.finish()]
    joined = ParsedText()
    for parsed in per_feed:
        joined += parsed
    return joined, per_feed


def calls_of(parsed: ParsedText) -> list[tuple[str | None, str]]:
    return [(fragment.name, fragment.arguments) for fragment in parsed.calls]


@given(CALLS, st.lists(st.integers(0, 400), max_size=16))
def test_required_calls_stream_their_arguments_piece_by_piece(calls, cuts):
    text = compact([{"name": name, "arguments": arguments} for name, arguments in calls])
    joined, per_feed = feed_all(RequiredCallsParser(NAMES), splits(text, cuts))
    assert joined.content == ""
    assert calls_of(joined) == [(name, compact(arguments)) for name, arguments in calls]
    opened = [f.index for parsed in per_feed for f in parsed.calls if f.name is not None]
    assert opened == list(range(len(calls)))  # each call opens once, in order, before its later pieces


@given(CALLS, st.data())
def test_required_calls_cut_short_are_the_calls_generated_so_far(calls, data):
    text = compact([{"name": name, "arguments": arguments} for name, arguments in calls])
    cut = data.draw(st.integers(0, len(text)))
    joined, _ = feed_all(RequiredCallsParser(NAMES), splits(text[:cut], data.draw(st.lists(st.integers(0, cut), max_size=8))))
    generated = [(f.name, f.arguments) for f in joined.calls]
    for (name, arguments), (expected_name, expected_arguments) in zip(generated, calls):
        assert name == expected_name and compact(expected_arguments).startswith(arguments)
    if not generated:
        assert joined.content == text[:cut]  # cut before any name was complete: text
    else:
        assert joined.content == ""


@given(ARGUMENTS, st.lists(st.integers(0, 200), max_size=10), st.sampled_from(["", " ", "\n  "]))
def test_a_named_call_is_its_arguments_whatever_the_split(arguments, cuts, space):
    text = space + compact(arguments) + space
    joined, per_feed = feed_all(NamedCallParser("add"), splits(text, cuts))
    assert joined == ParsedText(calls=[CallFragment(0, "add", compact(arguments))])
    assert sum(f.name is not None for parsed in per_feed for f in parsed.calls) == 1


def test_a_named_call_cut_short_or_empty_is_still_a_call():
    assert feed_all(NamedCallParser("get_weather"), ['{"city":"Os', 'lo","x', '1":'])[0].calls == [CallFragment(0, "get_weather", '{"city":"Oslo","x1":')]
    assert feed_all(NamedCallParser("get_weather"), [])[0].calls == [CallFragment(0, "get_weather", "")]


def test_a_required_call_cut_in_its_arguments_keeps_what_was_generated():
    text = '[{"name":"get_weather","arguments":{"city":"Oslo","extra_1":"a","extra_2'
    joined, _ = feed_all(RequiredCallsParser(NAMES), [text[:30], text[30:]])
    assert joined == ParsedText(calls=[CallFragment(0, "get_weather", '{"city":"Oslo","extra_1":"a","extra_2')])


def test_the_head_of_a_next_call_cut_before_its_name_is_left_out():
    text = '[{"name":"add","arguments":{"a":1}},{"name":"get_w'
    assert feed_all(RequiredCallsParser(NAMES), [text])[0] == ParsedText(calls=[CallFragment(0, "add", '{"a":1}')])


def test_output_that_is_not_the_calls_json_is_text_from_where_it_stops():
    unknown = '[{"name":"nope","arguments":{}}]'
    assert feed_all(RequiredCallsParser(NAMES), [unknown])[0] == ParsedText(unknown)
    listed = '[{"name":["add"],"arguments":{}}]'
    assert feed_all(RequiredCallsParser(NAMES), [listed])[0] == ParsedText(listed)
    after = '[{"name":"add","arguments":{}}] trailing'
    assert feed_all(RequiredCallsParser(NAMES), [after])[0] == ParsedText(" trailing", [CallFragment(0, "add", "{}")])


def test_what_is_held_between_calls_is_bounded():
    parser = RequiredCallsParser(NAMES)
    parsed = ParsedText()
    for char in "[" + " " * (2 * MAX_HEAD_BYTES):
        parsed += parser.feed(char)
        assert len(parser.held.encode()) <= MAX_HEAD_BYTES + 1
    assert parsed.content.startswith("[ ")


@example("\ud800", [])  # a lone surrogate: the byte count raised once
@given(HOSTILE_OUTPUTS, st.lists(st.integers(0, 300), max_size=12))
def test_no_output_makes_a_constrained_parser_raise(text, cuts):
    for new_parser in (lambda: RequiredCallsParser(NAMES), lambda: NamedCallParser("add")):
        split, whole = feed_all(new_parser(), splits(text, cuts))[0], feed_all(new_parser(), [text])[0]
        assert calls_of(split) == calls_of(whole)
        assert all(f.name in NAMES for f in split.calls if f.name is not None)


def test_deep_nesting_and_huge_numbers_stream_as_generated():
    deep = "[" * 5000 + "]" * 5000
    huge = "9" * 5000
    for arguments in (deep, huge, "1e999"):
        text = '[{"name":"add","arguments":' + arguments + "}]"
        assert feed_all(RequiredCallsParser(NAMES), [text])[0] == ParsedText(calls=[CallFragment(0, "add", arguments)])
