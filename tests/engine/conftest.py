from __future__ import annotations

import importlib.util

import pytest
import torch

from engine.config import DEFAULT_MODEL
from engine.core import EngineCore
from engine.loader.checkpoint import Checkpoint, load_checkpoint
from engine.loader.model_files import DEFAULT_MODEL_FILE, DEFAULT_MODEL_PACKAGE, ModelNotFoundError, default_model_path
from engine.loader.random_shapes import TINY_RANDOM
from engine.outputs import EngineOutput

requires_default_model = pytest.mark.skipif(
    importlib.util.find_spec(DEFAULT_MODEL_PACKAGE) is None, reason="the default model is not installed (a bare GPU machine; make install installs it)"
)


@pytest.fixture(scope="session")
def smollm_checkpoint() -> Checkpoint:
    """The default model's weights; skipped only where they are not installed (a bare GPU machine:
    `make install` always installs them, so CI runs these tests)."""
    try:
        return load_checkpoint(DEFAULT_MODEL)
    except ModelNotFoundError as error:
        pytest.skip(str(error))


@pytest.fixture(scope="session")
def transformers_model() -> torch.nn.Module:
    """The independent reference: the default model as Hugging Face transformers reads the same GGUF, in
    float32 (loaded once: reading the GGUF through transformers takes half a minute)."""
    transformers = pytest.importorskip("transformers")
    path = default_model_path()
    return transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=DEFAULT_MODEL_FILE, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tiny_checkpoint() -> Checkpoint:
    return load_checkpoint(TINY_RANDOM)


def run_until_done(engine: EngineCore, max_steps: int = 10_000) -> dict[str, list[EngineOutput]]:
    """Step until every request finished; the outputs of each request, in order."""
    outputs: dict[str, list[EngineOutput]] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return outputs
        for output in engine.step():
            outputs.setdefault(output.request_id, []).append(output)
    raise AssertionError(f"requests still unfinished after {max_steps} steps")


def output_ids(outputs: list[EngineOutput]) -> list[int]:
    return [token for output in outputs for token in output.new_token_ids]
