"""The ingress's OpenAPI document (``GET /openapi.json``), generated from the request models.

A request body is its model's fields plus every `SamplingParams` field the model does
not declare (the ingress passes those through), and nothing else: unknown names are a 400.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import version

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from deployments.anthropic.messages_request import CountTokensRequest, MessagesRequest
from deployments.openai.protocol import ChatCompletionRequest, CompletionRequest
from deployments.openai.responses_request import ResponsesRequest
from deployments.openai.tokenize import DetokenizeRequest, TokenizeRequest
from sampling.params import SamplingParams

REF_TEMPLATE = "#/components/schemas/{model}"
ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "code": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            },
        }
    },
}
# Forms a field accepts beyond its type (a `SamplingParams` before-validator turns them into the list).
ACCEPTED_FORMS = {"stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}, {"type": "null"}]}}
ENDPOINTS: dict[str, type[BaseModel]] = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest, "/v1/responses": ResponsesRequest}
"""The endpoints whose bodies take every `SamplingParams` field they do not declare as well (the
Responses API but those a chat declares, ``n`` and ``prompt_logprobs``: `deployments.openai.responses_request`)."""
NOT_PASSED_THROUGH: dict[str, set[str]] = {"/v1/responses": {*ChatCompletionRequest.model_fields, "n", "prompt_logprobs"}}
OWN_BODY_ENDPOINTS: dict[str, type[BaseModel]] = {
    "/v1/messages": MessagesRequest,
    "/v1/messages/count_tokens": CountTokensRequest,
    "/tokenize": TokenizeRequest,
    "/detokenize": DetokenizeRequest,
}
"""The endpoints whose bodies are their models' fields alone."""


@cache
def openapi_document() -> dict[str, object]:
    """OpenAPI 3.1: the POST endpoints' bodies, their JSON or SSE answers, and the error JSON (Anthropic's
    shape on the Messages API's routes, `deployments.anthropic.errors`)."""
    models = [*ENDPOINTS.values(), *OWN_BODY_ENDPOINTS.values(), SamplingParams]
    _, top = models_json_schema([(m, "validation") for m in models], ref_template=REF_TEMPLATE)
    schemas = top["$defs"]
    sampling = schemas.pop(SamplingParams.__name__)["properties"] | ACCEPTED_FORMS
    for path, model in ENDPOINTS.items():
        schema = schemas[model.__name__]
        excluded = {*schema["properties"], *NOT_PASSED_THROUGH.get(path, ())}
        passed_through = {name: field for name, field in sampling.items() if name not in excluded}
        schema["properties"] |= passed_through
        schema["additionalProperties"] = False
    schemas["ErrorResponse"] = ERROR_SCHEMA
    return {
        "openapi": "3.1.0",
        "info": {"title": "Spout", "version": version("spout")},
        "paths": {path: {"post": _operation(model)} for path, model in (ENDPOINTS | OWN_BODY_ENDPOINTS).items()},
        "components": {"schemas": schemas},
    }


def _operation(model: type[BaseModel]) -> dict[str, object]:
    error = {"content": {"application/json": {"schema": {"$ref": REF_TEMPLATE.format(model="ErrorResponse")}}}}
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": REF_TEMPLATE.format(model=model.__name__)}}}},
        "responses": {
            "200": {
                "description": "The answer as JSON; a completion or a response as Server-Sent Events when `stream` is true.",
                "content": {"application/json": {}, "text/event-stream": {}},
            },
            "default": {"description": "OpenAI error JSON.", **error},
        },
    }
