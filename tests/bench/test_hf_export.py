"""`bench.lib.hf_export`: the folder it writes loads back through Spout's own HF loader unchanged."""

from __future__ import annotations

import json

import torch

from bench.lib.hf_export import EGRESS_TINY, egress_tiny_checkpoint, export_hf_folder
from engine.loader.checkpoint import load_checkpoint


def test_egress_tiny_folder_round_trips(tmp_path):
    original = egress_tiny_checkpoint()
    folder = export_hf_folder(original, tmp_path / "egress-tiny")
    loaded = load_checkpoint(str(folder))
    assert loaded.config == EGRESS_TINY
    assert loaded.weights.keys() == original.weights.keys()
    for name, tensor in original.weights.items():
        assert torch.equal(loaded.weights[name], tensor), name
    assert loaded.tokenizer.eos_token_ids == original.tokenizer.eos_token_ids
    assert loaded.tokenizer.bos_token_id == original.tokenizer.bos_token_id
    assert loaded.tokenizer.encode("Hello, world") == original.tokenizer.encode("Hello, world")
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
