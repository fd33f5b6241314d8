"""Hypothesis strategies from the JSON Schema subset pydantic writes: local ``$ref``, ``anyOf``,
``oneOf`` (pydantic's discriminated unions, whose options exclude each other by their tag),
``const``, ``enum``, the seven types, numeric bounds, string patterns, array, string and object sizes.

(hypothesis-jsonschema 0.23 uses Hypothesis internals that current Hypothesis no longer has.)
Values stay inside the schema except where a bound is missing: sizes then default small.
"""

from __future__ import annotations

import math

from hypothesis import strategies as st

DEFAULT_MAX_ITEMS = 3
DEFAULT_MAX_LENGTH = 24
MAX_OPTIONAL_PROPERTIES = 4  # a few per object, so that most bodies are valid as a whole, not just per field


def from_schema(schema: dict, root: dict | None = None) -> st.SearchStrategy:
    """Values valid against ``schema``; ``$ref``s ("#/a/b") resolve against ``root`` (default: ``schema``)."""
    root = schema if root is None else root
    if "$ref" in schema:
        target = root
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        return st.deferred(lambda: from_schema(target, root))
    if "anyOf" in schema or "oneOf" in schema:
        return st.one_of([from_schema(option, root) for option in schema.get("anyOf", schema.get("oneOf"))])
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind is None:
        return st.none() | st.booleans() | st.integers() | st.text(max_size=DEFAULT_MAX_LENGTH)
    return _TYPES[kind](schema, root)


def _integer(schema: dict, root: dict) -> st.SearchStrategy:
    low = schema.get("minimum", schema.get("exclusiveMinimum", -math.inf) + 1)
    high = schema.get("maximum", schema.get("exclusiveMaximum", math.inf) - 1)
    return st.integers(None if low == -math.inf else int(low), None if high == math.inf else int(high))


def _number(schema: dict, root: dict) -> st.SearchStrategy:
    return st.floats(
        schema.get("minimum", schema.get("exclusiveMinimum")),
        schema.get("maximum", schema.get("exclusiveMaximum")),
        exclude_min="exclusiveMinimum" in schema,
        exclude_max="exclusiveMaximum" in schema,
        allow_nan=False,
        allow_infinity=False,
    )


def _string(schema: dict, root: dict) -> st.SearchStrategy:
    low, high = schema.get("minLength", 0), schema.get("maxLength", DEFAULT_MAX_LENGTH)
    if "pattern" in schema:  # a full match also matches as JSON Schema's search does
        return st.from_regex(schema["pattern"], fullmatch=True).filter(lambda text: low <= len(text) <= high)
    return st.text(min_size=low, max_size=high)


def _array(schema: dict, root: dict) -> st.SearchStrategy:
    items = from_schema(schema.get("items", {}), root)
    low = schema.get("minItems", 0)
    return st.lists(items, min_size=low, max_size=schema.get("maxItems", max(low, DEFAULT_MAX_ITEMS)))


@st.composite
def _object(draw: st.DrawFn, schema: dict, root: dict) -> dict:
    """Every required property, a few optional ones, and extra keys where a schema allows them."""
    properties, required = schema.get("properties", {}), schema.get("required", [])
    optional = [name for name in properties if name not in required]
    chosen = draw(st.lists(st.sampled_from(optional), max_size=MAX_OPTIONAL_PROPERTIES, unique=True)) if optional else []
    out = {name: draw(from_schema(properties[name], root)) for name in [*required, *chosen]}
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        keys = st.text(max_size=8).filter(lambda key: key not in properties)
        out |= draw(st.dictionaries(keys, from_schema(extra, root), max_size=schema.get("maxProperties", DEFAULT_MAX_ITEMS)))
    return out


_TYPES = {
    "null": lambda schema, root: st.none(),
    "boolean": lambda schema, root: st.booleans(),
    "integer": _integer,
    "number": _number,
    "string": _string,
    "array": _array,
    "object": _object,
}
