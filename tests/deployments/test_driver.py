"""The driver's API key handling: the key leaves the environment Ray's processes inherit."""

from __future__ import annotations

from deployments.driver import options_with_api_key
from deployments.launch import API_KEY_ENV


def test_the_api_key_moves_from_the_environment_into_the_options():
    environ = {API_KEY_ENV: "secret", "PATH": "/bin"}
    assert options_with_api_key({"model": "tiny-random"}, environ) == {"model": "tiny-random", "api_key": "secret"}
    assert environ == {"PATH": "/bin"}


def test_an_api_key_option_wins_and_the_environment_is_cleared_all_the_same():
    environ = {API_KEY_ENV: "from-env"}
    assert options_with_api_key({"api_key": "option"}, environ) == {"api_key": "option"}
    assert API_KEY_ENV not in environ
    assert options_with_api_key({}, {}) == {}
