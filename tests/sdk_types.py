"""Strict parsing with an SDK's own types: what the ``openai`` and ``anthropic`` packages declare,
validated (a missing field fails) with no field they do not declare, at any depth."""

from __future__ import annotations

from functools import cache
from typing import Any

import pydantic


def no_unknown_fields(value: object, where: str = "") -> None:
    if isinstance(value, pydantic.BaseModel):
        assert not value.model_extra, f"{where or type(value).__name__}: fields the SDK does not declare: {sorted(value.model_extra)}"
        for name in type(value).model_fields:
            no_unknown_fields(getattr(value, name), f"{where}.{name}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            no_unknown_fields(item, f"{where}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            no_unknown_fields(item, f"{where}.{key}")


@cache
def adapter(sdk_type: Any) -> pydantic.TypeAdapter:
    """One adapter per type: building one for a union of a hundred event types takes a large share of a second."""
    return pydantic.TypeAdapter(sdk_type)


def strict(sdk_type: Any, payload: object) -> Any:
    """``payload`` validated as ``sdk_type``, and checked for fields the SDK does not know."""
    value = adapter(sdk_type).validate_python(payload)
    no_unknown_fields(value)
    return value
