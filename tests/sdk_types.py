"""Strict parsing with an SDK's own types: what the ``openai`` and ``anthropic`` packages declare,
validated (a missing field fails) with no field they do not declare, at any depth."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Literal

import pydantic
from openai.types import Completion, CompletionChoice

Extensions = Mapping[str, frozenset[str]]
"""Fields a server adds on purpose beyond the SDK's (vLLM's ``stop_reason``), by the name of the SDK
type that carries them: allowed there and nowhere else."""


class StreamedCompletionChoice(CompletionChoice):
    """A streamed completion chunk's choice: its ``finish_reason`` is null until its last chunk, as OpenAI's
    own stream sends it (the SDK parses completion chunks as `Completion`, unvalidated, whose type says otherwise)."""

    finish_reason: Literal["stop", "length", "content_filter"] | None  # type: ignore[assignment]


class CompletionChunk(Completion):
    """A streamed completion chunk: `Completion` with `StreamedCompletionChoice` choices, nothing else relaxed."""

    choices: list[StreamedCompletionChoice]  # type: ignore[assignment]


VLLM_CHOICE_FIELDS: Extensions = {name: frozenset({"stop_reason"}) for name in ("Choice", "CompletionChoice", "StreamedCompletionChoice")}
"""vLLM's ``stop_reason`` on every completion and chat choice (whole and streamed), which Spout writes as vLLM does."""


def no_unknown_fields(value: object, where: str = "", extensions: Extensions | None = None) -> None:
    if isinstance(value, pydantic.BaseModel):
        allowed = (extensions or {}).get(type(value).__name__, frozenset())
        unknown = set(value.model_extra or ()) - allowed
        assert not unknown, f"{where or type(value).__name__}: fields the SDK does not declare: {sorted(unknown)}"
        for name in type(value).model_fields:
            no_unknown_fields(getattr(value, name), f"{where}.{name}", extensions)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            no_unknown_fields(item, f"{where}[{i}]", extensions)
    elif isinstance(value, dict):
        for key, item in value.items():
            no_unknown_fields(item, f"{where}.{key}", extensions)


@functools.cache
def adapter(sdk_type: Any) -> pydantic.TypeAdapter:
    """Built once per type: building one for a large union (the Responses API's stream events) takes a second."""
    return pydantic.TypeAdapter(sdk_type)


def strict(sdk_type: Any, payload: object, extensions: Extensions | None = None) -> Any:
    """``payload`` validated as ``sdk_type``, and checked for fields the SDK does not know (but ``extensions``)."""
    value = adapter(sdk_type).validate_python(payload)
    no_unknown_fields(value, extensions=extensions)
    return value
