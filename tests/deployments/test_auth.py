"""The API key: from the environment or the options, never empty, never shown, required on every route but /health."""

from __future__ import annotations

import pickle

import pytest
from pydantic import SecretStr, ValidationError

from deployments.auth import APIKeyCheck
from deployments.config import API_KEY_ENV, ServeArgs
from deployments.openai.errors import APIError

PROTECTED = ["/v1/completions", "/v1/chat/completions", "/v1/models", "/metrics", "/openapi.json", "/no/such/route", "/health/x", ""]


@pytest.mark.parametrize("path", PROTECTED)
def test_every_route_but_health_requires_the_key(path):
    check = APIKeyCheck(SecretStr("s3cret"))
    for header in (None, "", "Bearer wrong", "Bearer s3cret ", "s3cret", "bearer s3cret"):
        with pytest.raises(APIError) as refused:
            check.check(path, header)
        assert (refused.value.status, refused.value.code) == (401, "invalid_api_key")
    check.check(path, "Bearer s3cret")


def test_health_is_open_and_no_key_means_open():
    APIKeyCheck(SecretStr("s3cret")).check("/health", None)
    APIKeyCheck(None).check("/metrics", None)


def test_a_non_ascii_key_matches_its_utf8_header():
    header = "Bearer clé".encode().decode("latin-1")  # how Starlette hands over the header's bytes
    APIKeyCheck(SecretStr("clé")).check("/metrics", header)


def test_key_from_the_environment_unless_given():
    assert ServeArgs.from_options({}, {}).api_key is None
    assert ServeArgs.from_options({}, {API_KEY_ENV: "env-key"}).api_key.get_secret_value() == "env-key"
    assert ServeArgs.from_options({"api_key": "option"}, {API_KEY_ENV: "env-key"}).api_key.get_secret_value() == "option"


@pytest.mark.parametrize(("options", "environ"), [({}, {API_KEY_ENV: ""}), ({}, {API_KEY_ENV: "  "}), ({"api_key": ""}, {})])
def test_an_empty_key_is_refused_at_start_up(options, environ):
    with pytest.raises(ValidationError, match=API_KEY_ENV):
        ServeArgs.from_options(options, environ)


def test_the_key_is_never_shown_and_reaches_the_replica():
    args = ServeArgs(api_key="s3cret")
    assert "s3cret" not in repr(args) and "s3cret" not in str(args.model_dump())
    replica_args = ServeArgs.from_options(pickle.loads(pickle.dumps(args.model_dump())), {})
    assert replica_args.api_key.get_secret_value() == "s3cret"


def test_the_key_may_come_as_x_api_key_as_anthropics_clients_send_it():
    check = APIKeyCheck(SecretStr("s3cret"))
    check.check("/v1/messages", None, "s3cret")
    check.check("/v1/chat/completions", "Bearer wrong", "s3cret")
    for header in ("", "Bearer s3cret", "s3cret ", "wrong"):
        with pytest.raises(APIError):
            check.check("/v1/messages", None, header)
