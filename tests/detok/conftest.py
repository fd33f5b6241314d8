"""Shared fixtures: the default model's real tokenizer, built from its GGUF file."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from engine.loader.checkpoint import DEFAULT_MODEL, load_tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return load_tokenizer(DEFAULT_MODEL).tokenizer
