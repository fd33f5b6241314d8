"""`StructuredOutputs`: the constraint a request's output must satisfy (vLLM's ``structured_outputs``).

Exactly one of ``json`` (a JSON schema), ``json_object`` (any JSON object), ``regex``,
``choice`` (one of these strings), ``grammar`` (a Lark grammar, as llguidance reads it;
GBNF is converted) or ``structural_tag`` (free text in which each trigger starts a tagged
JSON value, `StructuralTag`) is set. vLLM's options shape the JSON ones:
``disable_any_whitespace``, ``whitespace_pattern`` and ``disable_additional_properties``.
This module only describes the constraint; the engine compiles it (`engine.grammar`), so the
detokenizer, which imports `sampling.params`, needs no grammar library.
"""

from __future__ import annotations

import json
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_CHOICES = 1024
"""The library's own bound on ``choice``; the server's limit (deployments/limits.py) is the text size."""


KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")


class TaggedStructure(BaseModel):
    """One structure of a structural tag: ``begin``, a JSON value valid against ``schema``, ``end``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    begin: str = Field(min_length=1)
    schema_: dict[str, Any] | bool = Field(alias="schema")
    end: str


class StructuralTag(BaseModel):
    """vLLM's ``structural_tag``: text is free until it writes one of ``triggers``; then it must go on
    as one of the ``structures`` whose ``begin`` starts with that trigger, and is free again after its ``end``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["structural_tag"] = "structural_tag"
    structures: list[TaggedStructure] = Field(min_length=1)
    triggers: list[str] = Field(min_length=1)

    @model_validator(mode="after")
    def _every_begin_has_a_trigger(self) -> StructuralTag:
        for structure in self.structures:
            if self.trigger_of(structure) is None:
                raise ValueError(f"structural_tag: no trigger starts the begin {structure.begin!r}")
        return self

    def trigger_of(self, structure: TaggedStructure) -> str | None:
        return next((trigger for trigger in self.triggers if trigger and structure.begin.startswith(trigger)), None)


class StructuredOutputs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    json_: dict[str, Any] | bool | None = Field(None, alias="json", description="A JSON schema (an object, or true for any JSON value).")
    json_object: bool | None = Field(None, description="true: any JSON object.")
    regex: str | None = None
    choice: list[str] | None = Field(None, min_length=1, max_length=MAX_CHOICES)
    grammar: str | None = Field(None, description="A Lark grammar (llguidance's dialect) or a GBNF grammar.")
    structural_tag: StructuralTag | None = Field(None, description="vLLM's structural tag: free text with tagged JSON values (an object or its JSON text).")
    disable_any_whitespace: bool | None = Field(
        None, description="JSON only. true or unset: JSON without whitespace between tokens (Spout's default); false: any whitespace, as vLLM's default."
    )
    whitespace_pattern: str | None = Field(None, description="JSON only: a regex for the whitespace allowed between JSON tokens.")
    disable_additional_properties: bool = Field(False, description="JSON only: objects of the schema that do not say take no other properties.")
    reasoning_end: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="The constraint applies after this text, free before it: the end of a reasoning model's thinking (the server's reasoning_parser sets it).",
    )

    @field_validator("structural_tag", mode="before")
    @classmethod
    def _tag_from_text(cls, value: object) -> object:
        """vLLM takes the structural tag as its JSON text; an object is taken too."""
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value)
        except json.JSONDecodeError as error:
            raise ValueError(f"the structural tag is not valid JSON: {error}") from error

    @field_validator("json_", mode="before")
    @classmethod
    def _schema_from_text(cls, value: object) -> object:
        """vLLM takes the schema as an object or as its JSON text."""
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value)
        except json.JSONDecodeError as error:
            raise ValueError(f"the JSON schema is not valid JSON: {error}") from error

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputs:
        given = [name for name in KINDS if self.kind_value(name) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"exactly one of {', '.join(KINDS)} must be given, got {given or 'none'}")
        json_options = [name for name in ("disable_any_whitespace", "whitespace_pattern", "disable_additional_properties") if getattr(self, name)]
        json_options += ["disable_any_whitespace"] if self.disable_any_whitespace is False else []
        if json_options and given[0] not in ("json", "json_object", "structural_tag"):
            raise ValueError(f"{json_options[0]} shapes JSON output only, not {given[0]}")
        if self.whitespace_pattern is not None and self.disable_any_whitespace:
            raise ValueError("whitespace_pattern allows whitespace, which disable_any_whitespace disables: give one of the two")
        return self

    def kind_value(self, name: str) -> object:
        return self.json_ if name == "json" else getattr(self, name)

    @cached_property
    def key(self) -> str:
        """The constraint as one text (equal constraints, equal keys), made once per object: the choices
        of a request share their parameters' constraint, so the engine makes it once per request."""
        return json.dumps(self.model_dump(mode="json", by_alias=True, exclude_defaults=True), separators=(",", ":"), sort_keys=True)

    def text_size(self) -> int:
        """UTF-8 bytes of the constraint's text (the schema as compact JSON): what the server's limit bounds."""
        tag = self.structural_tag.model_dump_json(by_alias=True) if self.structural_tag is not None else ""
        parts: list[str] = [json.dumps(self.json_, separators=(",", ":")) if self.json_ is not None else "", self.regex or "", self.grammar or "", tag]
        parts += [self.whitespace_pattern or "", self.reasoning_end or ""]
        parts += self.choice or []
        return sum(len(part.encode("utf-8", "surrogatepass")) for part in parts)


def json_schema_output(schema: dict[str, Any]) -> StructuredOutputs:
    """The constraint that the output is one JSON value valid against ``schema`` (tool calls use it)."""
    return StructuredOutputs(json=schema)
