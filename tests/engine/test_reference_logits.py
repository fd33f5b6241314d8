"""Independent check: our model matches Hugging Face transformers reading the same GGUF file."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.generate import generate
from engine.models.attention_metadata import ScheduledChunk, build_attention_metadata
from sampling.params import SamplingParams

transformers = pytest.importorskip("transformers")

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away, there lived",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
]
# Both sides dequantize the same GGUF to float32; they differ only in reduction order
# (fused SDPA vs eager softmax, summation in matmuls) over 30 layers. Measured: at most
# 3e-5 on logits of magnitude ~30. 1e-3 leaves a 30x margin, while a real defect (rope
# layout, q/k permutation, norm epsilon, GQA mapping) moves logits by 0.1 to 10.
LOGITS_ATOL = 1e-3
# bfloat16 weights and activations (the default on CPUs with AMX tiles) round every layer's
# input to 8 bits of mantissa. Measured against the float32 reference on these prompts: mean
# absolute logit difference 0.09 to 0.20, at most 1.1, and the same argmax at every position.
# A defect of the kind above moves the mean past 1 and the argmax at most positions.
BF16_MEAN_LOGITS_ATOL = 0.3


@pytest.fixture(scope="module")
def engine(smollm_checkpoint) -> EngineCore:
    return EngineCore(EngineConfig(max_num_seqs=1, max_model_len=512, dtype="float32"), smollm_checkpoint)


@pytest.fixture(scope="module")
def bf16_engine(smollm_checkpoint) -> EngineCore:
    return EngineCore(EngineConfig(max_num_seqs=1, max_model_len=512, dtype="bfloat16"), smollm_checkpoint)


def our_logits(engine: EngineCore, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab] float32 logits of one prefill of ``ids``."""
    runner = engine.runner
    meta = build_attention_metadata(
        [ScheduledChunk(block_ids=tuple(range(runner.kv_cache.num_blocks)), position=0, num_tokens=len(ids))], runner.kv_cache.block_size, runner.device
    )
    hidden = runner.model(torch.tensor(ids), meta, runner.kv_cache.keys, runner.kv_cache.values)
    return runner.model.compute_logits(hidden)


def our_last_logits(engine: EngineCore, ids: list[int]) -> torch.Tensor:
    return our_logits(engine, ids)[-1]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_last_position_logits_match_transformers(engine, transformers_model, prompt):
    ids = engine.tokenizer.encode(prompt)
    ours = our_last_logits(engine, ids)
    with torch.no_grad():
        theirs = transformers_model(torch.tensor([ids])).logits[0, -1]
    torch.testing.assert_close(ours, theirs.float(), atol=LOGITS_ATOL, rtol=0)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_bfloat16_logits_stay_near_transformers_float32_at_every_position(bf16_engine, transformers_model, prompt):
    ids = bf16_engine.tokenizer.encode(prompt)
    ours = our_logits(bf16_engine, ids)
    with torch.no_grad():
        theirs = transformers_model(torch.tensor([ids])).logits[0].float()
    assert (ours - theirs).abs().mean().item() < BF16_MEAN_LOGITS_ATOL
    assert ours.argmax(-1).tolist() == theirs.argmax(-1).tolist()


@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_greedy_continuation_matches_transformers_for_32_tokens(engine, transformers_model, prompt):
    ids = engine.tokenizer.encode(prompt)
    ours = generate(engine, ids, SamplingParams(temperature=0.0, max_tokens=32))
    eos = engine.tokenizer.eos_token_ids[0]
    with torch.no_grad():
        theirs = transformers_model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, eos_token_id=eos, pad_token_id=eos)
    assert ours == theirs[0, len(ids) :].tolist()
    assert len(ours) == 32 or ours[-1] == eos
