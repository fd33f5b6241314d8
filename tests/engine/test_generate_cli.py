"""The offline entry point, as a user runs it."""

from __future__ import annotations

import subprocess
import sys

from tests.engine.conftest import requires_default_model


@requires_default_model
def test_generate_says_paris():
    result = subprocess.run(
        [sys.executable, "-m", "engine.generate", "The capital of France is", "--max-tokens", "8"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert "Paris" in result.stdout


def test_generate_chat_with_tiny_random():
    result = subprocess.run(
        [sys.executable, "-m", "engine.generate", "Hi", "--chat", "--model", "tiny-random", "--max-tokens", "4"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert result.stdout.strip()
