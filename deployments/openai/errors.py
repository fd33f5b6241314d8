"""OpenAI error JSON: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import json
import logging
import traceback
from http import HTTPStatus

from pydantic import ValidationError
from starlette.responses import JSONResponse

logger = logging.getLogger(__name__)
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """An error answered to the client with ``status`` and OpenAI error JSON."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.code = code or HTTPStatus(status).phrase.lower().replace(" ", "_")

    def body(self) -> dict[str, object]:
        kind = _TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)

    def sse_frame(self) -> str:
        return f"data: {json.dumps(self.body())}\n\n"


def from_validation_error(error: ValidationError) -> APIError:
    """400 naming the first invalid top-level field; the message has the full location."""
    first = error.errors()[0]
    location = ".".join(str(part) for part in first["loc"])
    param = str(first["loc"][0]) if first["loc"] else None
    return APIError(400, f"{location}: {first['msg']}" if location else first["msg"], param=param, code="invalid_value")


def internal_error(error: Exception, where: str) -> APIError:
    """The 500 for a fault nobody foresaw in serving one request, logged by its type and frames
    only (a message may quote the request's text)."""
    logger.error("unhandled %s in %s\n%s", type(error).__name__, where, "".join(traceback.format_tb(error.__traceback__)))
    return APIError(500, "internal server error")
