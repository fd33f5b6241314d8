"""The bfloat16 MLP activation of prompt rows (`engine.kernels.silu_mul`, `engine.models.prompt_tiles.mlp_in_tiles`):
torch's float32 activation rounded once to bfloat16, but for a last-bit exp difference at a rounding
boundary; a row's MLP output its own whatever rows beside it; and the MLP's prompt rows through it,
its other rows keeping the float32 kernel's bits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import ModelConfig
from engine.kernels import quant_matmul, silu_mul
from engine.models.llama import MLP
from engine.models.prompt_tiles import MatmulRows, PromptTiles, cpu_has_amx, mlp_in_tiles
from engine.models.quant_linear import add_prompt_tiles, merged, quantize_linears
from tests.engine.test_quant_linear import random_weight

pytestmark = pytest.mark.skipif(silu_mul.load() is None, reason="no C++ kernel on this machine")
needs_tiles = pytest.mark.skipif(not cpu_has_amx() or quant_matmul.load() is None, reason="no AMX bfloat16 tiles, or no C++ kernel, on this CPU")

HIDDEN, INTERMEDIATE = 576, 1536


def torch_activation(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [R, 2I] bfloat16 -> silu(gate) * up in float32, rounded once to bfloat16."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    return (F.silu(gate) * up).bfloat16()


def test_the_activation_is_torchs_rounded_once_but_for_boundary_cases():
    gate_up = (torch.randn(512, 2 * INTERMEDIATE, generator=torch.Generator().manual_seed(0)) * 3).bfloat16()
    ours = silu_mul.silu_mul_bf16(gate_up, torch.empty(512, INTERMEDIATE, dtype=torch.bfloat16))
    expected = torch_activation(gate_up)
    differ = ours.view(torch.int16) != expected.view(torch.int16)
    assert differ.float().mean().item() < 1e-4
    ulps = (ours.view(torch.int16).int() - expected.view(torch.int16).int()).abs()
    assert ulps.max().item() <= 1  # where they differ, by one bfloat16 unit


def test_special_values():
    gate = torch.tensor([0.0, -0.0, 1.0, -1.0, 20.0, -20.0, 80.0, -80.0, float("inf"), float("-inf"), float("nan"), 3e38, -3e38, 1e-30, -1e-30, 0.5])
    gate_up = torch.cat([gate, torch.full_like(gate, 2.0)]).view(1, -1).bfloat16()
    ours = silu_mul.silu_mul_bf16(gate_up, torch.empty(1, len(gate), dtype=torch.bfloat16))
    torch.testing.assert_close(ours, torch_activation(gate_up), rtol=0, atol=0, equal_nan=True)


def test_rows_and_outputs_may_be_strided():
    gate_up = torch.randn(8, 4 * 64, generator=torch.Generator().manual_seed(1)).bfloat16()[:, 64:192]  # [8, 128], rows 256 apart
    out = torch.zeros(8, 128, dtype=torch.bfloat16)
    silu_mul.silu_mul_bf16(gate_up, out[:, 32:96])
    assert torch.equal(out[:, 32:96], silu_mul.silu_mul_bf16(gate_up.contiguous(), torch.empty(8, 64, dtype=torch.bfloat16)))
    assert not out[:, :32].any() and not out[:, 96:].any()


def test_bad_shapes_are_refused():
    with pytest.raises(RuntimeError, match="multiple of 16"):
        silu_mul.silu_mul_bf16(torch.zeros(2, 40, dtype=torch.bfloat16), torch.empty(2, 20, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="bfloat16"):
        silu_mul.silu_mul_bf16(torch.zeros(2, 64), torch.empty(2, 32))


@pytest.fixture(scope="module")
def tiles() -> tuple[PromptTiles, PromptTiles]:
    generator = torch.Generator().manual_seed(2)
    gate_up = PromptTiles(torch.randn(2 * INTERMEDIATE, HIDDEN, generator=generator) / HIDDEN**0.5)
    down = PromptTiles(torch.randn(HIDDEN, INTERMEDIATE, generator=generator) / INTERMEDIATE**0.5)
    return gate_up, down


@needs_tiles
@settings(max_examples=20, deadline=None)
@given(st.integers(1, 600), st.integers(0, 99))
def test_a_rows_mlp_output_is_its_own_in_any_batch(tiles, num_rows, offset):
    x = torch.randn(700, HIDDEN, generator=torch.Generator().manual_seed(3))
    everything = mlp_in_tiles(*tiles, x)
    assert torch.equal(mlp_in_tiles(*tiles, x[offset : offset + num_rows]), everything[offset : offset + num_rows])


@needs_tiles
def test_within_bfloat16_rounding_of_the_tiles_with_a_float32_activation(tiles):
    gate_up, down = tiles
    x = torch.randn(200, HIDDEN, generator=torch.Generator().manual_seed(4))
    gate, up = gate_up.matmul(x).chunk(2, dim=-1)
    expected = down.matmul(F.silu(gate) * up)
    torch.testing.assert_close(mlp_in_tiles(gate_up, down, x), expected, rtol=0, atol=0.01 * expected.abs().max().item())


def quantized_mlp(merge: bool) -> MLP:
    """The default model's MLP shape on random 4-bit weights, gate and up merged or not, with tiles."""
    mlp = MLP(ModelConfig(1000, HIDDEN, INTERMEDIATE, 1, 9, 3, 64, 1e-5, 10000.0, 2048, True))
    quantize_linears(
        mlp,
        {
            f"{name}.weight": random_weight("q4_1", *getattr(mlp, name).weight.shape, seed=seed)
            for seed, name in enumerate(("gate_proj", "up_proj", "down_proj"))
        },
    )
    if merge:
        mlp.gate_up_proj = merged([mlp.gate_proj, mlp.up_proj])
        del mlp.gate_proj, mlp.up_proj
    add_prompt_tiles(mlp)
    return mlp


@needs_tiles
@pytest.mark.parametrize("takes_tiles", [[False] * 3 + [True] * 9 + [False] * 4, [True] * 16, [False, True] * 8], ids=["between", "all", "scattered"])
def test_the_mlps_prompt_rows_take_the_tiles_and_the_others_keep_the_kernels_bits(takes_tiles):
    mlp = quantized_mlp(merge=True)
    gate_up, down = mlp.prompt_tiles()
    x = torch.randn(16, HIDDEN, generator=torch.Generator().manual_seed(5))
    tiled = torch.tensor(takes_tiles)
    out = mlp(x, MatmulRows.of(tiled))
    assert torch.equal(out[tiled], mlp_in_tiles(gate_up, down, x[tiled]))
    if not tiled.all():
        assert torch.equal(out[~tiled], mlp(x[~tiled]))


@needs_tiles
def test_unmerged_gate_and_up_keep_the_float32_activation_between_their_tiles():
    mlp = quantized_mlp(merge=False)
    assert mlp.prompt_tiles() is None
    x = torch.randn(16, HIDDEN, generator=torch.Generator().manual_seed(6))
    rows = MatmulRows.of(torch.ones(16, dtype=torch.bool))
    gate, up = mlp.gate_proj.prompt_tiles.matmul(x), mlp.up_proj.prompt_tiles.matmul(x)
    assert torch.equal(mlp(x, rows), mlp.down_proj.prompt_tiles.matmul(F.silu(gate) * up))
