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
from engine.config import EngineConfig
from engine.core import EngineCore
from engine.kernels import quant_matmul
from engine.models.attention_metadata import ScheduledChunk, build_attention_metadata
from engine.models.prompt_tiles import ROW_TILE, SHORT_PROMPT_ROW_TILE, SHORT_PROMPT_TOKENS, MatmulRows, PromptTiles, RowGroup, cpu_has_amx
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
@given(st.sampled_from([ROW_TILE, SHORT_PROMPT_ROW_TILE]), st.integers(1, 3 * ROW_TILE), st.integers(0, 99))
def test_a_row_is_the_same_in_any_tile_at_any_place(tiles, tile_rows, num_rows, offset):
    x = torch.randn(3 * ROW_TILE + 100, 576, generator=torch.Generator().manual_seed(1))
    everything = tiles.matmul(x, tile_rows)
    assert torch.equal(tiles.matmul(x[offset : offset + num_rows], tile_rows), everything[offset : offset + num_rows])


def test_within_bfloat16_rounding_of_the_float32_product():
    weight = torch.randn(576, 1536, generator=torch.Generator().manual_seed(2))
    x = torch.randn(200, 1536, generator=torch.Generator().manual_seed(3))
    expected = F.linear(x, weight)
    torch.testing.assert_close(PromptTiles(weight).matmul(x, ROW_TILE), expected, rtol=0, atol=0.02 * expected.abs().max().item())


S, L = SHORT_PROMPT_ROW_TILE, ROW_TILE


@pytest.mark.parametrize(
    "tile_rows",
    [
        [0] * 3 + [L] * 4 + [0] * 5 + [L] * 2 + [0] * 6,
        [0] * 5 + [L] * 15,
        [L] * 12 + [0] * 8,
        [L] * 20,
        [0] * 4 + [S] * 6 + [L] * 10,
        [0] * 4 + [S] * 6 + [0] * 4 + [L] * 6,
        [S] * 8 + [L] * 4 + [S] * 8,
    ],
    ids=["scattered", "after-decodes", "before-outputs", "all", "short-then-long", "between", "long-between-short"],
)
def test_each_row_takes_its_own_tiles_or_the_kernels_bits(tile_rows):
    weight = random_weight("q4_1", 192, 576)
    linear = QuantLinear(weight, bias=None)
    linear.prompt_tiles = PromptTiles(weight.dequantize())
    x = torch.randn(20, 576, generator=torch.Generator().manual_seed(4))
    sizes = torch.tensor(tile_rows)
    out = linear(x, MatmulRows.of(sizes))
    assert torch.equal(out[sizes == 0], weight.matmul(x[sizes == 0]))
    for size in (S, L):
        assert torch.equal(out[sizes == size], linear.prompt_tiles.matmul(x[sizes == size], size))
    assert torch.equal(linear(x), weight.matmul(x))
    assert MatmulRows.of(torch.zeros(20, dtype=torch.int64)) is None


def test_matmul_rows_are_the_prompt_positions_of_each_chunk_in_its_prompts_tiles():
    long = SHORT_PROMPT_TOKENS
    prefill = ScheduledChunk((0,), position=0, num_tokens=5, prompt_tokens=5)
    decode = ScheduledChunk((1,), position=9, num_tokens=1, prompt_tokens=7)
    recomputed = ScheduledChunk((2, 3, 4, 5, 6), position=long - 3, num_tokens=6, prompt_tokens=long)  # 3 prompt positions, 3 outputs
    rows = build_attention_metadata([decode, prefill, recomputed], 16, torch.device("cpu"), prompt_tiles=True).matmul_rows
    assert rows.groups[0].tile_rows == 0 and rows.groups[0].rows.tolist() == [0, 9, 10, 11]
    assert rows.groups[1:] == (RowGroup(S, slice(1, 6)), RowGroup(L, slice(6, 9)))
    rows = build_attention_metadata([decode, decode, prefill], 16, torch.device("cpu"), prompt_tiles=True).matmul_rows
    assert rows.groups == (RowGroup(0, slice(0, 2)), RowGroup(S, slice(2, 7)))
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


def test_by_default_the_tiles_are_made_only_where_they_fit_in_memory(smollm_checkpoint, monkeypatch):
    monkeypatch.setattr(model_runner, "host_available_bytes", lambda: 400 << 20)  # a quarter of it is under the copy's 212 MB
    assert not EngineCore(EngineConfig(max_num_seqs=1, max_model_len=64), smollm_checkpoint).runner.prompt_tiles
    assert EngineCore(EngineConfig(max_num_seqs=1, max_model_len=64, bf16_prompt_matmuls=True), smollm_checkpoint).runner.prompt_tiles
