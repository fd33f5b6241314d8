"""Anthropic's error shape, ``{"type": "error", "error": {"type", "message"}}``, for the Messages API's routes."""

from __future__ import annotations

import json

from starlette.responses import JSONResponse

from deployments.openai.errors import APIError

MESSAGES_PATH = "/v1/messages"
"""Where the Messages API's routes start: their errors take Anthropic's shape."""
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def error_body(error: APIError) -> dict[str, object]:
    kind = _TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error_body(error), status_code=error.status)


def error_frame(error: APIError) -> str:
    """A stream's error event (the stream ends after it)."""
    return f"event: error\ndata: {json.dumps(error_body(error))}\n\n"
