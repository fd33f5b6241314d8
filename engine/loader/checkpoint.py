"""Resolve a model name to a checkpoint: config, float32 weights and tokenizer.

The tokenizer alone, without torch or the model code, comes from `engine.loader.model_files`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.config import ModelConfig
from engine.loader.gguf_weights import load_gguf_checkpoint
from engine.loader.hf_folder import load_hf_checkpoint
from engine.loader.model_files import default_tokenizer, gguf_text_tokenizer, hf_text_tokenizer, resolve_model_path
from engine.loader.random_shapes import RANDOM_MODEL_SHAPES
from engine.loader.random_weights import random_weights
from engine.models.quant_linear import QuantizedWeight
from engine.tokenizer import TextTokenizer

logger = logging.getLogger(__name__)


@dataclass
class Checkpoint:
    name: str
    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: TextTokenizer
    quantized: dict[str, QuantizedWeight] = field(default_factory=dict)
    """The 4-bit and 8-bit blocks of a GGUF's quantized matrices, by weight name (their float32
    values are in ``weights`` too); a CPU float32 model may compute with them (`engine.models.quant_linear`)."""


def load_checkpoint(model: str) -> Checkpoint:
    """``smollm2-135m-instruct``, a random-weights model (`RANDOM_MODEL_SHAPES`), a ``.gguf`` file or a HF model folder."""
    started = time.perf_counter()
    logger.info("loading model %s", model)
    if model in RANDOM_MODEL_SHAPES:
        checkpoint = random_checkpoint(model)
    elif (path := resolve_model_path(model)).suffix == ".gguf":
        checkpoint = _gguf(model, path)
    else:
        checkpoint = _hf_folder(model, path)
    logger.info("loaded %s (%d tensors) in %.1f s", model, len(checkpoint.weights), time.perf_counter() - started)
    return checkpoint


def random_checkpoint(model: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> Checkpoint:
    """A model of `RANDOM_MODEL_SHAPES` with seeded random weights made on ``device`` in ``dtype``, and the default model's tokenizer."""
    config = RANDOM_MODEL_SHAPES[model]
    return Checkpoint(name=model, config=config, weights=random_weights(config, device=device, dtype=dtype), tokenizer=default_tokenizer())


def _gguf(name: str, path: Path) -> Checkpoint:
    contents = load_gguf_checkpoint(path)
    return Checkpoint(
        name=name, config=contents.config, weights=contents.weights, tokenizer=gguf_text_tokenizer(contents.metadata), quantized=contents.quantized
    )


def _hf_folder(name: str, folder: Path) -> Checkpoint:
    config, weights = load_hf_checkpoint(folder)
    return Checkpoint(name=name, config=config, weights=weights, tokenizer=hf_text_tokenizer(folder))
