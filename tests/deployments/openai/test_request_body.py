"""The body limit holds while reading; malformed or too deeply nested JSON is a 400 naming the limit."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, field_validator

from deployments.openai.errors import APIError
from deployments.openai.request_body import INLINE_PARSE_BYTES, json_depth, parse_json_object, read_body, validate_body


async def _chunks(parts: list[bytes], consumed: list[int]):
    for part in parts:
        consumed.append(len(part))
        yield part


def _read(parts: list[bytes], declared: str | None, limit: int) -> tuple[bytes | APIError, int]:
    consumed: list[int] = []
    try:
        return asyncio.run(read_body(_chunks(parts, consumed), declared, limit)), len(consumed)
    except APIError as error:
        return error, len(consumed)


def test_body_within_the_limit_is_read_whole():
    assert _read([b"ab", b"cd"], "4", 4) == (b"abcd", 2)
    assert _read([b"ab", b"cd"], None, 4) == (b"abcd", 2)


def test_declared_length_over_the_limit_reads_nothing():
    error, consumed = _read([b"x" * 10], "11", 10)
    assert isinstance(error, APIError) and error.status == 413 and "max_body_bytes" in error.message
    assert consumed == 0


@pytest.mark.parametrize("declared", [None, "5", "not-a-number"], ids=["chunked", "lying", "garbage"])
def test_reading_stops_at_the_limit(declared):
    error, consumed = _read([b"x" * 6] * 1000, declared, 10)
    assert isinstance(error, APIError) and error.status == 413
    assert consumed == 2  # the chunk that passed the limit is the last one read


def test_depth_limit_names_the_limit():
    assert parse_json_object(b'{"a": [[1]]}', max_depth=3) == {"a": [[1]]}
    with pytest.raises(APIError, match="max_json_depth") as refused:
        parse_json_object(b'{"a": [[[1]]]}', max_depth=3)
    assert (refused.value.status, refused.value.code) == (400, "json_too_deep")


def test_very_deep_nesting_is_a_400_not_a_crash():
    for body in (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", b"[" * 1_000_000):
        with pytest.raises(APIError) as refused:
            parse_json_object(body, max_depth=32)
        assert refused.value.status == 400


def test_brackets_inside_strings_do_not_count():
    body = json.dumps({"stop": ["[[[[", "}}}", '\\"[{', "\\"], "x": [{}]}).encode()
    assert json_depth(body) == 3
    assert parse_json_object(body, max_depth=3)["stop"][0] == "[[[["


@pytest.mark.parametrize("body", [b'{"a": ', b"[1, 2]", b"\xff\xfe", b'{"a": "\\ud800"}'])
def test_malformed_json(body):
    with pytest.raises(APIError) as refused:
        parse_json_object(body, max_depth=32)
    assert refused.value.status == 400


def _depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet=st.sampled_from('[]{}"\\ax,:é')),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(alphabet=st.sampled_from('[]{}"\\b')), inner, max_size=4),
    max_leaves=30,
)


@given(JSON, st.booleans())
def test_depth_matches_a_recursive_count(value, ascii_only):
    assert json_depth(json.dumps(value, ensure_ascii=ascii_only).encode()) == _depth(value)


@given(st.dictionaries(st.text(alphabet=st.sampled_from('[]{}"a')), JSON, max_size=3), st.integers(1, 6))
def test_the_depth_limit_holds_whether_or_not_the_brackets_are_scanned(value, max_depth):
    # A body with no more brackets (strings included) than the limit skips the scan.
    body = json.dumps(value).encode()
    if _depth(value) <= max_depth:
        assert parse_json_object(body, max_depth) == value
    else:
        with pytest.raises(APIError, match="max_json_depth"):
            parse_json_object(body, max_depth)


class Recorded(BaseModel):
    """A body that notes the thread it is validated on."""

    prompt: list[int]
    threads: ClassVar[list[str]] = []

    @field_validator("prompt")
    @classmethod
    def _note_thread(cls, value: list[int]) -> list[int]:
        cls.threads.append(threading.current_thread().name)
        return value


def test_large_bodies_are_parsed_off_the_event_loop():
    small = json.dumps({"prompt": [1, 2]}).encode()
    large = json.dumps({"prompt": list(range(INLINE_PARSE_BYTES // 4))}).encode()
    assert len(small) <= INLINE_PARSE_BYTES < len(large)

    async def validate_both() -> str:
        assert (await validate_body(small, 32, Recorded)).prompt == [1, 2]
        assert len((await validate_body(large, 32, Recorded)).prompt) == INLINE_PARSE_BYTES // 4
        return threading.current_thread().name

    Recorded.threads.clear()
    loop_thread = asyncio.run(validate_both())
    assert Recorded.threads[0] == loop_thread and Recorded.threads[1] != loop_thread


def test_an_invalid_body_names_the_field():
    with pytest.raises(APIError) as refused:
        asyncio.run(validate_body(b'{"prompt": "x"}', 32, Recorded))
    assert (refused.value.status, refused.value.param) == (400, "prompt")
