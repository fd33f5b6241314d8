"""HF folders (Llama, Mistral, Qwen2; sharded or not; rope scaling) load and match transformers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.loader.checkpoint import Checkpoint, load_checkpoint
from engine.models.attention_metadata import ScheduledChunk, build_attention_metadata

transformers = pytest.importorskip("transformers")

SMALL = dict(
    vocab_size=49152,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
)
CASES = {
    "llama": (transformers.LlamaConfig, dict(tie_word_embeddings=False)),
    "llama3_rope_tied": (
        transformers.LlamaConfig,
        dict(
            tie_word_embeddings=True,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
            rope_theta=500000.0,
        ),
    ),
    "linear_rope": (transformers.LlamaConfig, dict(rope_scaling={"rope_type": "linear", "factor": 4.0})),
    "mistral": (transformers.MistralConfig, dict(sliding_window=None)),
    "qwen2_yarn": (
        transformers.Qwen2Config,
        dict(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}),
    ),
}


def _save_folder(tmp_path: Path, name: str, tokenizer_checkpoint: Checkpoint, shard: bool) -> tuple[Path, torch.nn.Module]:
    config_class, extra = CASES[name]
    torch.manual_seed(0)
    model_class = {
        transformers.LlamaConfig: transformers.LlamaForCausalLM,
        transformers.MistralConfig: transformers.MistralForCausalLM,
        transformers.Qwen2Config: transformers.Qwen2ForCausalLM,
    }[config_class]
    model = model_class(config_class(**SMALL, **extra)).eval()
    with torch.no_grad():  # random biases, so a dropped bias shows
        for module_name, param in model.named_parameters():
            if module_name.endswith("bias"):
                param.normal_()
    folder = tmp_path / name
    model.save_pretrained(folder, max_shard_size="2MB" if shard else "1GB")
    tokenizer_checkpoint.tokenizer.tokenizer.save(str(folder / "tokenizer.json"))
    return folder, model


@pytest.mark.parametrize("name", list(CASES))
def test_hf_folder_logits_match_transformers(tmp_path, tiny_checkpoint, name):
    folder, reference = _save_folder(tmp_path, name, tiny_checkpoint, shard=name == "llama")
    if name == "llama":
        assert (folder / "model.safetensors.index.json").exists()
    checkpoint = load_checkpoint(str(folder))
    engine = EngineCore(EngineConfig(model=str(folder), max_num_seqs=2, max_model_len=1024, dtype="float32"), checkpoint)
    ids = list(range(100, 400))  # past the yarn/llama3 original context, so scaling matters
    runner = engine.runner
    meta = build_attention_metadata(
        [ScheduledChunk(block_ids=tuple(range(runner.kv_cache.num_blocks)), position=0, num_tokens=len(ids))], runner.kv_cache.block_size, runner.device
    )
    hidden = runner.model(torch.tensor(ids, device=runner.device), meta, runner.kv_cache.keys, runner.kv_cache.values)
    ours = runner.model.compute_logits(hidden).cpu()
    with torch.no_grad():
        theirs = reference(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_unsupported_architecture_is_a_clear_error(tmp_path):
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        load_checkpoint(str(folder))
