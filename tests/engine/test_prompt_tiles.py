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

from engine import model_runner
from engine.config import BATCHED_TOKENS_BY_DEVICE, BATCHED_TOKENS_WITH_PROMPT_TILES, EngineConfig
from engine.core import EngineCore
from engine.kernels import quant_matmul
from engine.models.attention_metadata import ScheduledChunk, build_attention_metadata
from engine.models.prompt_tiles import ROW_TILE, TILE_SIZES, MatmulRows, PromptTiles, RowGroup, cpu_has_amx, tile_plan, tile_sizes_for
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


@pytest.mark.parametrize("shape", [(192, 576), (960, 576), (576, 1536), (3072, 576)])
def test_a_weight_takes_only_the_sizes_that_give_the_reference_bits(shape):
    tiles = PromptTiles(torch.randn(*shape, generator=torch.Generator().manual_seed(5)))
    assert ROW_TILE in tiles.tile_sizes and set(tiles.tile_sizes) <= set(TILE_SIZES)
    x = torch.randn(2 * TILE_SIZES[-1], shape[1], generator=torch.Generator().manual_seed(6))  # not the probe
    reference = tiles.in_tiles(x, [ROW_TILE] * (len(x) // ROW_TILE))
    for size in tiles.tile_sizes:
        assert torch.equal(tiles.in_tiles(x, [size] * -(-len(x) // size)), reference), size
    assert tiles.tile_sizes[0] < ROW_TILE  # here oneDNN gives 48-128 rows the same bits: a short prompt pays for fewer rows


def test_a_size_that_changes_the_bits_is_not_taken(monkeypatch):
    call = torch.ops.mkldnn._linear_pointwise

    def off_by_one_ulp_at_64_rows(x, *args):
        out = call(x, *args)
        return out.nextafter(torch.full_like(out, float("inf"))) if x.shape[0] == 64 else out

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", off_by_one_ulp_at_64_rows)
    assert 64 not in tile_sizes_for.__wrapped__(192, 576) and 48 in tile_sizes_for.__wrapped__(192, 576)


@pytest.mark.parametrize(
    ("num_rows", "plan"),
    [(1, [48]), (48, [48]), (49, [64]), (100, [128]), (200, [256]), (257, [256, 48]), (600, [256, 256, 96])],
)
def test_the_plan_takes_the_largest_tiles_then_the_smallest_that_holds_the_rest(num_rows, plan):
    assert tile_plan(num_rows, TILE_SIZES) == plan
    assert tile_plan(num_rows, (ROW_TILE,)) == [ROW_TILE] * -(-num_rows // ROW_TILE)


def test_within_bfloat16_rounding_of_the_float32_product():
    weight = torch.randn(576, 1536, generator=torch.Generator().manual_seed(2))
    x = torch.randn(200, 1536, generator=torch.Generator().manual_seed(3))
    expected = F.linear(x, weight)
    torch.testing.assert_close(PromptTiles(weight).matmul(x), expected, rtol=0, atol=0.02 * expected.abs().max().item())


T, F32 = True, False


@pytest.mark.parametrize(
    "takes_tiles",
    [
        [F32] * 3 + [T] * 4 + [F32] * 5 + [T] * 2 + [F32] * 6,
        [F32] * 5 + [T] * 15,
        [T] * 12 + [F32] * 8,
        [T] * 20,
        [F32] * 4 + [T] * 6 + [F32] * 4 + [T] * 6,
    ],
    ids=["scattered", "after-decodes", "before-outputs", "all", "between"],
)
def test_each_row_takes_the_tiles_or_the_kernels_bits(takes_tiles):
    weight = random_weight("q4_1", 192, 576)
    linear = QuantLinear(weight, bias=None)
    linear.prompt_tiles = PromptTiles(weight.dequantize())
    x = torch.randn(20, 576, generator=torch.Generator().manual_seed(4))
    tiled = torch.tensor(takes_tiles)
    out = linear(x, MatmulRows.of(tiled))
    assert torch.equal(out[~tiled], weight.matmul(x[~tiled]))
    assert torch.equal(out[tiled], linear.prompt_tiles.matmul(x[tiled]))
    assert torch.equal(linear(x), weight.matmul(x))
    assert MatmulRows.of(torch.zeros(20, dtype=torch.bool)) is None


def test_matmul_rows_are_the_prompt_positions_of_each_chunk():
    prefill = ScheduledChunk((0,), position=0, num_tokens=5, prompt_tokens=5)
    decode = ScheduledChunk((1,), position=9, num_tokens=1, prompt_tokens=7)
    recomputed = ScheduledChunk((2, 3, 4, 5, 6), position=61, num_tokens=6, prompt_tokens=64)  # 3 prompt positions, 3 outputs
    rows = build_attention_metadata([decode, prefill, recomputed], 16, torch.device("cpu"), prompt_tiles=True).matmul_rows
    assert rows.groups[0] == RowGroup(F32, rows.groups[0].rows) and rows.groups[0].rows.tolist() == [0, 9, 10, 11]
    assert rows.groups[1:] == (RowGroup(T, slice(1, 9)),)
    rows = build_attention_metadata([decode, decode, prefill], 16, torch.device("cpu"), prompt_tiles=True).matmul_rows
    assert rows.groups == (RowGroup(F32, slice(0, 2)), RowGroup(T, slice(2, 7)))
    assert build_attention_metadata([decode], 16, torch.device("cpu"), prompt_tiles=True).matmul_rows is None
    assert build_attention_metadata([prefill], 16, torch.device("cpu")).matmul_rows is None


@pytest.fixture(scope="module")
def engines(smollm_checkpoint) -> tuple[EngineCore, EngineCore]:
    tiled = EngineCore(EngineConfig(max_num_seqs=8, max_model_len=256), smollm_checkpoint)  # the default where the CPU has AMX
    plain = EngineCore(EngineConfig(max_num_seqs=8, max_model_len=256, bf16_prompt_matmuls=False), smollm_checkpoint)
    assert tiled.runner.prompt_tiles and not plain.runner.prompt_tiles
    return tiled, plain


def test_with_the_tiles_the_cpus_step_budget_doubles(engines):
    tiled, plain = engines
    assert tiled.scheduler.max_num_batched_tokens == BATCHED_TOKENS_WITH_PROMPT_TILES == 2 * BATCHED_TOKENS_BY_DEVICE["cpu"]
    assert plain.scheduler.max_num_batched_tokens == BATCHED_TOKENS_BY_DEVICE["cpu"]


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


def test_by_default_the_tiles_are_made_only_where_they_fit_in_memory(smollm_checkpoint, monkeypatch):
    monkeypatch.setattr(model_runner, "host_available_bytes", lambda: 400 << 20)  # a quarter of it is under the copy's 212 MB
    assert not EngineCore(EngineConfig(max_num_seqs=1, max_model_len=64), smollm_checkpoint).runner.prompt_tiles
    assert EngineCore(EngineConfig(max_num_seqs=1, max_model_len=64, bf16_prompt_matmuls=True), smollm_checkpoint).runner.prompt_tiles
