"""bfloat16 tiles for prompt tokens (`engine.models.prompt_tiles`): a row's result is its own whatever
tile and batch it falls in, within bfloat16's rounding of the float32 product; prompt positions take
the tiles and every other row keeps the float32 kernel's bits; and the default model with them keeps
its greedy text on the README's prompts, its logits near float32's, and a request's outputs the same
alone and among others."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.kernels import quant_matmul
from engine.models.attention_metadata import ScheduledChunk, build_attention_metadata
from engine.models.prompt_tiles import ROW_TILE, MatmulRows, PromptTiles, cpu_has_amx
from engine.models.quant_linear import QuantLinear
from sampling.params import SamplingParams
from tests.engine.test_quant_linear import README_PROMPTS, random_weight, readme_greedy_ids, readme_logits

pytestmark = pytest.mark.skipif(not cpu_has_amx() or quant_matmul.load() is None, reason="no AMX bfloat16 tiles, or no C++ kernel, on this CPU")

BF16_MEAN_LOGITS_ATOL = 0.3
"""As tests/engine/test_reference_logits.py's for a whole bfloat16 model."""


@pytest.fixture(scope="module")
def tiles() -> PromptTiles:
    return PromptTiles(torch.randn(192, 576, generator=torch.Generator().manual_seed(0)))


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3 * ROW_TILE), st.integers(0, 99))
def test_a_row_is_the_same_in_any_tile_at_any_place(tiles, num_rows, offset):
    x = torch.randn(3 * ROW_TILE + 100, 576, generator=torch.Generator().manual_seed(1))
    everything = tiles.matmul(x)
    assert torch.equal(tiles.matmul(x[offset : offset + num_rows]), everything[offset : offset + num_rows])


def test_within_bfloat16_rounding_of_the_float32_product():
    weight = torch.randn(576, 1536, generator=torch.Generator().manual_seed(2))
    x = torch.randn(200, 1536, generator=torch.Generator().manual_seed(3))
    expected = F.linear(x, weight)
    torch.testing.assert_close(PromptTiles(weight).matmul(x), expected, rtol=0, atol=0.02 * expected.abs().max().item())


@pytest.mark.parametrize(
    "is_prompt",
    [[0] * 3 + [1] * 4 + [0] * 5 + [1] * 2 + [0] * 6, [0] * 5 + [1] * 15, [1] * 12 + [0] * 8, [1] * 20, [0] * 4 + [1] * 6 + [0] * 10],
    ids=["scattered", "after-decodes", "before-outputs", "all", "between"],
)
def test_prompt_rows_take_the_tiles_and_the_others_keep_the_kernels_bits(is_prompt):
    weight = random_weight("q4_1", 192, 576)
    linear = QuantLinear(weight, bias=None)
    linear.prompt_tiles = PromptTiles(weight.dequantize())
    x = torch.randn(20, 576, generator=torch.Generator().manual_seed(4))
    mask = torch.tensor(is_prompt, dtype=torch.bool)
    out = linear(x, MatmulRows.of(mask))
    assert torch.equal(out[~mask], weight.matmul(x)[~mask])
    assert torch.equal(out[mask], linear.prompt_tiles.matmul(x[mask]))
    assert torch.equal(linear(x), weight.matmul(x))
    assert MatmulRows.of(torch.zeros(20, dtype=torch.bool)) is None


def test_matmul_rows_are_the_prompt_positions_of_each_chunk():
    prefill = ScheduledChunk((0,), position=0, num_tokens=5, prompt_tokens=5)
    decode = ScheduledChunk((1,), position=9, num_tokens=1, prompt_tokens=7)
    recomputed = ScheduledChunk((2, 3), position=4, num_tokens=6, prompt_tokens=7)  # positions 4-6 prompt, 7-9 output
    rows = build_attention_metadata([decode, prefill, recomputed], 16, torch.device("cpu"), prompt_tiles=True).matmul_rows
    assert rows.prompt == slice(1, 9) and rows.other.tolist() == [0, 9, 10, 11]
    rows = build_attention_metadata([prefill, decode, prefill], 16, torch.device("cpu"), prompt_tiles=True).matmul_rows
    assert rows.prompt.tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10] and rows.other.tolist() == [5]
    rows = build_attention_metadata([decode, decode, prefill], 16, torch.device("cpu"), prompt_tiles=True).matmul_rows
    assert (rows.prompt, rows.other) == (slice(2, 7), slice(0, 2))
    assert build_attention_metadata([decode], 16, torch.device("cpu"), prompt_tiles=True).matmul_rows is None
    assert build_attention_metadata([prefill], 16, torch.device("cpu")).matmul_rows is None


@pytest.fixture(scope="module")
def engines(smollm_checkpoint) -> tuple[EngineCore, EngineCore]:
    tiled = EngineCore(EngineConfig(max_num_seqs=8, max_model_len=256), smollm_checkpoint)  # the default where the CPU has AMX
    plain = EngineCore(EngineConfig(max_num_seqs=8, max_model_len=256, bf16_prompt_matmuls=False), smollm_checkpoint)
    assert tiled.runner.prompt_tiles and not plain.runner.prompt_tiles
    return tiled, plain


@pytest.mark.parametrize("prompt", README_PROMPTS)
def test_logits_stay_near_the_float32_paths(engines, prompt):
    ours, reference = readme_logits(engines, prompt)
    assert (ours - reference).abs().mean().item() < BF16_MEAN_LOGITS_ATOL
    assert torch.equal(ours.argmax(-1), reference.argmax(-1))


@pytest.mark.parametrize("prompt", README_PROMPTS)
def test_greedy_text_is_the_float32_paths(engines, prompt):
    tiled, plain = readme_greedy_ids(engines, prompt)
    assert tiled == plain


def run_together(engine: EngineCore, prompts: dict[str, list[int]], params: SamplingParams) -> dict[str, tuple[list[int], list[float]]]:
    """Each request's output ids and their logprobs, all added at once."""
    for request_id, ids in prompts.items():
        engine.add_request(request_id, ids, params)
    outputs: dict[str, tuple[list[int], list[float]]] = {request_id: ([], []) for request_id in prompts}
    while engine.has_unfinished_requests():
        for output in engine.step():
            outputs[output.request_id][0].extend(output.new_token_ids)
            outputs[output.request_id][1].extend(entry.logprob for entry in output.logprobs or [])
    return outputs


def test_a_requests_outputs_are_the_same_alone_and_among_others(engines):
    tiled, _ = engines
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=1)
    target = tiled.tokenizer.encode("The capital of France is")
    others = {f"other{n}": [(97 * n + 7 * position) % 40000 + 100 for position in range(40 * n + 3)] for n in range(1, 6)}
    alone = run_together(tiled, {"target": target}, params)["target"]
    together = run_together(tiled, {**others, "target": target}, params)["target"]
    assert alone == together and len(alone[1]) == 6
