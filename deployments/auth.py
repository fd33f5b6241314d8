"""`APIKeyCheck`: when the server has an API key, every route but ``/health`` requires it.

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
        self.expected = None if api_key is None else f"Bearer {api_key.get_secret_value()}".encode()

    def check(self, path: str, authorization: str | None) -> None:
        """Raise a 401 `APIError` unless ``path`` is open or ``authorization`` (the header) carries the key."""
        if self.expected is None or path in OPEN_PATHS:
            return
        given = (authorization or "").encode("latin-1")  # Starlette decodes header bytes as latin-1
        if not hmac.compare_digest(given, self.expected):
            raise APIError(401, "invalid or missing API key", code="invalid_api_key")
