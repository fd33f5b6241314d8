"""`PackedLinear` computes what ``F.linear`` computes, and a bfloat16 CPU engine uses it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.models.packed_linear import PackedLinear, can_pack, pack_linears

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(not can_pack(CPU, torch.bfloat16), reason="this torch build has no oneDNN prepacked linear")


@pytest.mark.parametrize("rows", [1, 7, 64, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_equals_f_linear(rows, bias):
    torch.manual_seed(rows)
    linear = nn.Linear(576, 1536, bias=bias).to(torch.bfloat16)
    x = torch.randn(rows, 576, dtype=torch.bfloat16)
    torch.testing.assert_close(PackedLinear(linear)(x), F.linear(x, linear.weight, linear.bias), atol=0, rtol=0)


def test_pack_linears_replaces_every_linear_and_nothing_else():
    model = nn.Sequential(nn.Linear(8, 8), nn.ModuleList([nn.LayerNorm(8), nn.Sequential(nn.Linear(8, 4, bias=False))])).to(torch.bfloat16)
    pack_linears(model)
    kinds = [type(m) for m in model.modules()]
    assert nn.Linear not in kinds
    assert kinds.count(PackedLinear) == 2 and kinds.count(nn.LayerNorm) == 1


def test_a_bfloat16_cpu_engine_packs_its_decoder_and_keeps_its_output_weight(tiny_checkpoint):
    engine = EngineCore(EngineConfig(model="tiny-random", device="cpu", dtype="bfloat16", max_num_seqs=2, max_model_len=64), tiny_checkpoint)
    model = engine.runner.model
    assert not any(isinstance(m, nn.Linear) for m in model.layers.modules())
    assert isinstance(model.layers[0].mlp.down_proj, PackedLinear)
    assert model.output_weight.dtype == torch.bfloat16
