"""The CPU's fused lm_head argmax: the same ids as the sampler on the full logits, ties included,
and only for batches that need nothing but the argmax."""

from __future__ import annotations

import torch

from engine.config import EngineConfig, ModelConfig
from engine.core import EngineCore
from engine.loader.checkpoint import Checkpoint
from engine.models.llama import ARGMAX_VOCAB_CHUNK, LlamaForCausalLM
from sampling.params import SamplingParams
from tests.engine.conftest import output_ids, run_until_done


def test_argmax_logits_is_the_first_maximum_of_the_logits():
    config = ModelConfig(
        vocab_size=2 * ARGMAX_VOCAB_CHUNK + 100,
        hidden_size=8,
        intermediate_size=16,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=4,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config, max_positions=64).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        weight = model.embed_tokens.weight
        weight.copy_(0.1 * torch.randn(weight.shape, generator=generator))
        # Exact ties (one nonzero term each, so no rounding) across chunks, within a chunk and in
        # the last, short chunk: the first index must win.
        axes = torch.eye(8)
        for row, axis in (
            (3, 0),
            (ARGMAX_VOCAB_CHUNK + 7, 0),
            (2 * ARGMAX_VOCAB_CHUNK + 50, 0),
            (ARGMAX_VOCAB_CHUNK + 8, 1),
            (ARGMAX_VOCAB_CHUNK + 9, 1),
            (2 * ARGMAX_VOCAB_CHUNK + 60, 2),
        ):
            weight[row] = 5 * axes[axis]
    hidden = torch.cat([torch.randn(64, 8, generator=generator), axes[:3]])
    expected = model.compute_logits(hidden).max(dim=-1).indices
    assert expected[-3:].tolist() == [3, ARGMAX_VOCAB_CHUNK + 8, 2 * ARGMAX_VOCAB_CHUNK + 60]
    assert torch.equal(model.argmax_logits(hidden), expected)


def generate(checkpoint: Checkpoint, fuse_argmax: bool, params: list[SamplingParams]) -> dict[str, list[int]]:
    engine = EngineCore(EngineConfig(model="tiny-random", max_num_seqs=8, max_model_len=256), checkpoint=checkpoint)
    engine.runner.fuse_argmax = fuse_argmax
    fused_calls = 0
    argmax_logits = engine.runner.model.argmax_logits

    def counted(hidden: torch.Tensor) -> torch.Tensor:
        nonlocal fused_calls
        fused_calls += 1
        return argmax_logits(hidden)

    engine.runner.model.argmax_logits = counted
    for i, p in enumerate(params):
        engine.add_request(f"r{i}", [100 + i, 2000 + 7 * i, 30000 - i], p)
    outputs = {request_id: output_ids(o) for request_id, o in run_until_done(engine).items()}
    return outputs | {"fused_calls": [fused_calls]}


def test_greedy_batches_decode_the_same_fused_or_not(tiny_checkpoint: Checkpoint):
    greedy = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)] * 6
    fused, reference = generate(tiny_checkpoint, True, greedy), generate(tiny_checkpoint, False, greedy)
    assert fused.pop("fused_calls") == [24] and reference.pop("fused_calls") == [0]
    assert fused == reference


def test_a_request_that_edits_logits_turns_the_fused_path_off(tiny_checkpoint: Checkpoint):
    params = [
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, repetition_penalty=1.5),
    ]
    fused = generate(tiny_checkpoint, True, params)
    assert fused.pop("fused_calls") == [0]
    assert fused == {k: v for k, v in generate(tiny_checkpoint, False, params).items() if k != "fused_calls"}
