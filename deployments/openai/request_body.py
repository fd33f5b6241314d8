"""Reading a JSON request body within the server's limits: size while reading, then nesting depth.

A large body is parsed and validated on a worker thread: a megabyte of token ids costs tens of
milliseconds of parsing, which the ingress event loop (shared by every stream) must not spend.

The size limit holds whatever the client declares: the body is read chunk by chunk and the
read stops at the limit, so a chunked upload or a lying ``Content-Length`` costs no more memory
than an honest one. The depth is measured without recursion, on the parsed (so well-formed)
body, with whole-buffer operations: strings are cut out, then the brackets are summed.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from typing import TypeVar

import numpy as np
from pydantic import BaseModel, ValidationError

from deployments.openai.errors import APIError, from_validation_error

Body = TypeVar("Body", bound=BaseModel)
INLINE_PARSE_BYTES = 65_536  # larger bodies are parsed on a worker thread

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # linear on well-formed JSON
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_DEPTH_STEP = np.zeros(256, dtype=np.int8)
_DEPTH_STEP[[ord("["), ord("{")]] = 1
_DEPTH_STEP[[ord("]"), ord("}")]] = -1


def _too_large(max_bytes: int) -> APIError:
    return APIError(413, f"request body over {max_bytes} bytes (max_body_bytes)", code="body_too_large")


async def read_body(chunks: AsyncIterator[bytes], declared_length: str | None, max_bytes: int) -> bytes:
    """The body from its ASGI chunks; 413 as soon as the declared or the received size passes ``max_bytes``."""
    if declared_length is not None and declared_length.isdigit() and int(declared_length) > max_bytes:
        raise _too_large(max_bytes)
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        parts.append(chunk)
    return b"".join(parts)


def json_depth(body: bytes) -> int:
    """The deepest nesting of arrays and objects in well-formed JSON ``body`` (0 for a scalar)."""
    steps = _DEPTH_STEP[np.frombuffer(_STRING.sub(b"", body), dtype=np.uint8)]
    brackets = steps[steps != 0]
    return int(np.cumsum(brackets, dtype=np.int32).max(initial=0))


def parse_json_object(body: bytes, max_depth: int) -> dict:
    """The body as a JSON object; 400 for malformed JSON, text that is not UTF-8, lone surrogates,
    a non-object, or nesting deeper than ``max_depth``."""
    try:
        parsed = json.loads(body)
        if _SURROGATE_ESCAPE.search(body):  # only an escape can carry a surrogate; a lone one is not text
            json.dumps(parsed, ensure_ascii=False).encode()
    except (ValueError, RecursionError) as error:  # not JSON, not UTF-8, lone surrogates, ints over 4300 digits, deep nesting
        raise APIError(400, f"malformed JSON: {error}", code="invalid_json") from error
    if not isinstance(parsed, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    if body.count(b"{") + body.count(b"[") <= max_depth:
        return parsed  # no deeper than its brackets, counted in strings too: the scan below is not needed
    depth = json_depth(body)
    if depth > max_depth:
        raise APIError(400, f"the request body nests {depth} levels deep; this server's limit is {max_depth} (max_json_depth)", code="json_too_deep")
    return parsed


def _validate(body: bytes, max_depth: int, model: type[Body]) -> Body:
    try:
        return model.model_validate(parse_json_object(body, max_depth))
    except ValidationError as error:
        raise from_validation_error(error) from error


async def validate_body(body: bytes, max_depth: int, model: type[Body]) -> Body:
    """``body`` parsed (`parse_json_object`) and validated as ``model``; 400 naming the first invalid field."""
    if len(body) <= INLINE_PARSE_BYTES:
        return _validate(body, max_depth, model)
    return await asyncio.to_thread(_validate, body, max_depth, model)
