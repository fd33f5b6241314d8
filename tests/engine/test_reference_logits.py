"""Independent check: our model matches Hugging Face transformers reading the same GGUF file."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.generate import generate
from engine.loader.checkpoint import DEFAULT_MODEL_FILE, default_model_path
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


@pytest.fixture(scope="module")
def reference_model() -> torch.nn.Module:
    path = default_model_path()
    return transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=DEFAULT_MODEL_FILE, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engine(smollm_checkpoint) -> EngineCore:
    return EngineCore(EngineConfig(max_num_seqs=1, max_model_len=512, dtype="float32"), smollm_checkpoint)


def our_last_logits(engine: EngineCore, ids: list[int]) -> torch.Tensor:
    runner = engine.runner
    meta = build_attention_metadata(
        [ScheduledChunk(block_ids=tuple(range(runner.kv_cache.num_blocks)), position=0, num_tokens=len(ids))], runner.kv_cache.block_size, runner.device
    )
    hidden = runner.model(torch.tensor(ids), meta, runner.kv_cache.keys, runner.kv_cache.values)
    return runner.model.compute_logits(hidden[-1:])[0]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_last_position_logits_match_transformers(engine, reference_model, prompt):
    ids = engine.tokenizer.encode(prompt)
    ours = our_last_logits(engine, ids)
    with torch.no_grad():
        theirs = reference_model(torch.tensor([ids])).logits[0, -1]
    torch.testing.assert_close(ours, theirs.float(), atol=LOGITS_ATOL, rtol=0)


@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_greedy_continuation_matches_transformers_for_32_tokens(engine, reference_model, prompt):
    ids = engine.tokenizer.encode(prompt)
    ours = generate(engine, ids, SamplingParams(temperature=0.0, max_tokens=32))
    eos = engine.tokenizer.eos_token_ids[0]
    with torch.no_grad():
        theirs = reference_model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, eos_token_id=eos, pad_token_id=eos)
    assert ours == theirs[0, len(ids) :].tolist()
    assert len(ours) == 32 or ours[-1] == eos
