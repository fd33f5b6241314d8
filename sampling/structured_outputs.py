"""`StructuredOutputs`: the constraint a request's output must satisfy (vLLM's ``structured_outputs``).

Exactly one of ``json`` (a JSON schema), ``json_object`` (any JSON object), ``regex``,
``choice`` (one of these strings) or ``grammar`` (a Lark grammar, as llguidance reads it;
GBNF is converted) is set. This module only describes the constraint; the engine compiles
it (`engine.grammar`), so the detokenizer, which imports `sampling.params`, needs no grammar
library.
"""

from __future__ import annotations

import json
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_CHOICES = 1024
"""The library's own bound on ``choice``; the server's limit (deployments/limits.py) is the text size."""


class StructuredOutputs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    json_: dict[str, Any] | bool | None = Field(None, alias="json", description="A JSON schema (an object, or true for any JSON value).")
    json_object: bool | None = Field(None, description="true: any JSON object.")
    regex: str | None = None
    choice: list[str] | None = Field(None, min_length=1, max_length=MAX_CHOICES)
    grammar: str | None = Field(None, description="A Lark grammar (llguidance's dialect) or a GBNF grammar.")

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
        given = [name for name in ("json", "json_object", "regex", "choice", "grammar") if self.kind_value(name) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"exactly one of json, json_object, regex, choice or grammar must be given, got {given or 'none'}")
        return self

    def kind_value(self, name: str) -> object:
        return self.json_ if name == "json" else getattr(self, name)

    @cached_property
    def key(self) -> str:
        """The constraint as one text (equal constraints, equal keys), made once per object: the choices
        of a request share their parameters' constraint, so the engine makes it once per request."""
        return json.dumps([self.json_, self.json_object, self.regex, self.choice, self.grammar], separators=(",", ":"), sort_keys=True)

    def text_size(self) -> int:
        """UTF-8 bytes of the constraint's text (the schema as compact JSON): what the server's limit bounds."""
        parts: list[str] = [json.dumps(self.json_, separators=(",", ":")) if self.json_ is not None else "", self.regex or "", self.grammar or ""]
        parts += self.choice or []
        return sum(len(part.encode("utf-8", "surrogatepass")) for part in parts)


def json_schema_output(schema: dict[str, Any]) -> StructuredOutputs:
    """The constraint that the output is one JSON value valid against ``schema`` (tool calls use it)."""
    return StructuredOutputs(json=schema)
