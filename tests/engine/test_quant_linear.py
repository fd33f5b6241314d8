"""The quantized matmul kernel: the dequantized float32 product in another summation order, the
same for a row whatever else is in the batch, and the default model unchanged by it (logits within
float32 tolerance of the dequantized path, the same greedy text on the README's prompts)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.generate import generate
from engine.kernels import quant_matmul
from engine.models.attention_metadata import ScheduledChunk, build_attention_metadata
from engine.models.quant_linear import MergedQuantLinear, QuantizedWeight, QuantLinear, merged
from sampling.params import SamplingParams

pytestmark = pytest.mark.skipif(quant_matmul.load() is None, reason="the kernel cannot be built here (no C++ compiler)")

LOGITS_ATOL = 1e-3
"""As tests/engine/test_reference_logits.py: float32 in another summation order over 30 layers."""
README_PROMPTS = ["The capital of France is", "What is the capital of France?"]


def random_weight(kind: str, rows: int, cols: int, seed: int = 0) -> QuantizedWeight:
    generator = torch.Generator().manual_seed(seed)
    scales = torch.rand(rows, cols // 32, generator=generator).half().float() * 0.02
    if kind == "q8_0":
        return QuantizedWeight(torch.randint(-128, 128, (rows, cols), generator=generator, dtype=torch.int8), scales, None)
    nibbles = torch.randint(0, 256, (rows, cols // 2), generator=generator, dtype=torch.uint8)
    mins = -8 * scales if kind == "q4_0" else -torch.rand(rows, cols // 32, generator=generator).half().float() * 0.1
    return QuantizedWeight(nibbles, scales, mins)


@pytest.mark.parametrize("kind", ["q4_0", "q4_1", "q8_0"])
@pytest.mark.parametrize("shape", [(64, 96), (576, 1536), (1536, 576)])
def test_matches_the_dequantized_float32_product(kind, shape):
    weight = random_weight(kind, *shape)
    x = torch.randn(70, shape[1], generator=torch.Generator().manual_seed(1))
    expected = F.linear(x, weight.dequantize())
    torch.testing.assert_close(weight.matmul(x), expected, rtol=0, atol=1e-5 * expected.abs().max().item())


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
def test_a_row_is_the_same_alone_and_in_any_batch(kind):
    weight = random_weight(kind, 576, 1536)
    x = torch.randn(300, 1536, generator=torch.Generator().manual_seed(2))
    batched = weight.matmul(x)  # several token blocks and tiles, with remainders
    for size in (1, 3, 64):
        assert torch.equal(weight.matmul(x[:size]), batched[:size])
    alone = torch.cat([weight.matmul(x[index : index + 1]) for index in range(64)])
    assert torch.equal(alone, batched[:64])
    assert torch.equal(weight.matmul(x[131:132]), batched[131:132])


def plant_row(weight: QuantizedWeight, row: int, direction: torch.Tensor) -> None:
    """Make weight row ``row`` the largest one along ``direction`` [K]: weights of the largest size, with its signs."""
    positive = direction > 0
    weight.scales[row] = 1.0
    if weight.mins is None:
        weight.q[row] = torch.where(positive, 127, -127).to(torch.int8)
        return
    nibbles = torch.where(positive, 15, 0).to(torch.uint8).view(-1, 2, 16)  # blocks of 32: low halves, high halves
    weight.q[row] = (nibbles[:, 0] | (nibbles[:, 1] << 4)).flatten()
    weight.mins[row] = -7.5


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
@pytest.mark.parametrize("num_tokens", [1, 2, 3, 4, 5, 70])
def test_argmax_is_the_first_maximum_of_the_product(kind, num_tokens):
    """The head kernel's argmax equals ``matmul(x).max(-1).indices``, ties included: token i's largest
    row is repeated later in the weight, and the first must win wherever the chunks split the rows."""
    weight = random_weight(kind, 5000, 64, seed=3)
    x = torch.randn(num_tokens, 64, generator=torch.Generator().manual_seed(4))
    repeat = [(11, 4000), (2500, 2501), (17, 4999)][:num_tokens]
    for token, (first, later) in enumerate(repeat):
        for row in (first, later):
            plant_row(weight, row, x[token])
    expected = weight.matmul(x).max(dim=-1).indices
    assert expected[: len(repeat)].tolist() == [first for first, _ in repeat]
    assert torch.equal(weight.argmax(x), expected)


def test_rows_of_the_weight_are_views_of_the_same_product():
    weight = random_weight("q8_0", 256, 64)
    x = torch.randn(5, 64)
    assert torch.equal(weight.rows(64, 128).matmul(x), weight.matmul(x)[:, 64:128])


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
@pytest.mark.parametrize("num_tokens", [1, 3, 70])
def test_merged_projections_are_each_linears_own_bits(kind, num_tokens):
    shapes = [(576, 576), (192, 576), (192, 576)]
    linears = [QuantLinear(random_weight(kind, *shape, seed=index), torch.randn(shape[0])) for index, shape in enumerate(shapes)]
    group = merged(linears)
    assert isinstance(group, MergedQuantLinear)
    x = torch.randn(num_tokens, 576, generator=torch.Generator().manual_seed(3))
    outputs = group(x)
    assert [tuple(out.shape) for out in outputs] == [(num_tokens, rows) for rows, _ in shapes]
    for out, linear in zip(outputs, linears, strict=True):
        assert torch.equal(out, linear(x))


def test_linears_of_other_formats_or_biases_are_not_merged():
    q4, q8 = random_weight("q4_1", 64, 96), random_weight("q8_0", 64, 96)
    assert merged([QuantLinear(q4, None), QuantLinear(q8, None)]) is None
    assert merged([QuantLinear(q4, torch.zeros(64)), QuantLinear(q4, None)]) is None
    assert merged([QuantLinear(q4, None), torch.nn.Linear(96, 64, bias=False)]) is None
    assert merged([QuantLinear(q4, None), QuantLinear(random_weight("q4_1", 64, 128), None)]) is None


def test_the_default_models_layers_merge_their_projections(engines):
    quantized, dequantized = engines
    for layer in quantized.runner.model.layers:
        assert layer.self_attn.qkv_proj is not None and layer.mlp.gate_up_proj is not None
        assert not hasattr(layer.self_attn, "q_proj") and not hasattr(layer.mlp, "up_proj")
    assert all(layer.self_attn.qkv_proj is None for layer in dequantized.runner.model.layers)


def test_the_default_models_blocks_are_its_float32_weights(smollm_checkpoint):
    assert len(smollm_checkpoint.quantized) == 211  # 7 matrices in each of 30 layers, and the tied embedding (Q8_0)
    for name, weight in smollm_checkpoint.quantized.items():
        assert torch.equal(weight.dequantize(), smollm_checkpoint.weights[name]), name


@pytest.fixture(scope="module")
def engines(smollm_checkpoint) -> tuple[EngineCore, EngineCore]:
    config = EngineConfig(max_num_seqs=1, max_model_len=256, bf16_prompt_matmuls=False)  # every token through the kernel
    quantized, dequantized = (
        EngineCore(config, smollm_checkpoint),
        EngineCore(EngineConfig(max_num_seqs=1, max_model_len=256, quantized_weights=False), smollm_checkpoint),
    )
    assert quantized.runner.quantized and not dequantized.runner.quantized
    return quantized, dequantized


def readme_logits(engines: tuple[EngineCore, EngineCore], prompt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Each engine's logits at every position of a README prompt."""
    ids = engines[0].tokenizer.encode(prompt)
    first, second = (logits(engine, ids) for engine in engines)
    return first, second


def logits(engine: EngineCore, ids: list[int]) -> torch.Tensor:
    """[len(ids), V]: the logits at every position of the prompt ``ids``, computed as the engine computes a prompt."""
    runner = engine.runner
    chunk = ScheduledChunk(block_ids=tuple(range(runner.kv_cache.num_blocks)), position=0, num_tokens=len(ids), prompt_tokens=len(ids))
    meta = build_attention_metadata([chunk], runner.kv_cache.block_size, runner.device, prompt_tiles=runner.prompt_tiles)
    return runner.model.compute_logits(runner.model(torch.tensor(ids), meta, runner.kv_cache.keys, runner.kv_cache.values))


def readme_greedy_ids(engines: tuple[EngineCore, EngineCore], prompt: str) -> tuple[list[int], list[int]]:
    """32 greedy tokens of each engine after a README prompt, as the README runs it (a question in the
    chat template, a sentence to continue as it is)."""
    tokenizer = engines[0].tokenizer
    ids = tokenizer.encode_chat([{"role": "user", "content": prompt}]) if prompt.endswith("?") else tokenizer.encode(prompt)
    params = SamplingParams(temperature=0.0, max_tokens=32)
    first, second = (generate(engine, ids, params) for engine in engines)
    return first, second


@pytest.mark.parametrize("prompt", README_PROMPTS)
def test_logits_stay_within_float32_tolerance_of_the_dequantized_path(engines, prompt):
    ours, reference = readme_logits(engines, prompt)
    torch.testing.assert_close(ours, reference, rtol=0, atol=LOGITS_ATOL)
    assert torch.equal(ours.argmax(-1), reference.argmax(-1))


@pytest.mark.parametrize("prompt", README_PROMPTS)
def test_greedy_text_is_the_dequantized_paths(engines, prompt):
    quantized, dequantized = readme_greedy_ids(engines, prompt)
    assert quantized == dequantized
