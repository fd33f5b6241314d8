"""Shared fixtures: the default model's real tokenizer, built from its GGUF file."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from engine.config import DEFAULT_MODEL
from engine.loader.model_files import load_tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return load_tokenizer(DEFAULT_MODEL).tokenizer
