"""`APIKeyCheck`: when the server has an API key, every route but ``/health`` requires it, as
``Authorization: Bearer <key>`` or (as Anthropic's clients send it) ``x-api-key: <key>``.

The check runs before the route is looked up, so that an unknown route answers 401 like a
known one and routes cannot be probed; the key is compared in constant time.
"""

from __future__ import annotations

import hmac

from pydantic import SecretStr

from deployments.openai.errors import APIError

OPEN_PATHS = frozenset({"/health"})


class APIKeyCheck:
    def __init__(self, api_key: SecretStr | None) -> None:
        self.key = None if api_key is None else api_key.get_secret_value().encode()
        self.expected = None if self.key is None else b"Bearer " + self.key

    def check(self, path: str, authorization: str | None, x_api_key: str | None = None) -> None:
        """Raise a 401 `APIError` unless ``path`` is open, ``authorization`` (the header) carries the
        key, or ``x_api_key`` (the ``x-api-key`` header) is the key."""
        if self.expected is None or self.key is None or path in OPEN_PATHS:
            return
        # Starlette decodes header bytes as latin-1; both headers are compared, in constant time.
        bearer = hmac.compare_digest((authorization or "").encode("latin-1"), self.expected)
        plain = hmac.compare_digest((x_api_key or "").encode("latin-1"), self.key) if x_api_key is not None else False
        if not (bearer or plain):
            raise APIError(401, "invalid or missing API key", code="invalid_api_key")
