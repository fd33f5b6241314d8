"""`CpuDecode`: a decode step through the CPU's kernels without the modules gives the modules' hidden
states bit for bit, at every batch size a mixed workload reaches; other steps and other models keep the modules."""

from __future__ import annotations

import torch

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.loader.checkpoint import Checkpoint
from engine.models.attention_metadata import AttentionMetadata
from engine.models.cpu_decode import CpuDecode
from sampling.params import SamplingParams
from tests.engine.conftest import run_until_done


class CheckedDecode:
    """`CpuDecode` that also runs the modules on each step it takes and compares their hidden states."""

    def __init__(self, engine: EngineCore, fast: CpuDecode) -> None:
        self.engine, self.fast = engine, fast
        self.batches: list[int] = []

    def fits(self, meta: AttentionMetadata) -> bool:
        return self.fast.fits(meta)

    def __call__(self, input_ids: torch.Tensor, meta: AttentionMetadata, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
        ours = self.fast(input_ids, meta, keys, values)
        modules = self.engine.runner.model(input_ids, meta, keys, values)  # writes the same keys and values again
        assert torch.equal(ours, modules), f"a decode step of {input_ids.shape[0]} sequences differs from the modules'"
        self.batches.append(input_ids.shape[0])
        return ours


def test_decode_steps_are_the_modules_bit_for_bit(smollm_checkpoint: Checkpoint) -> None:
    engine = EngineCore(EngineConfig(max_num_seqs=8, max_model_len=256, max_num_batched_tokens=64), smollm_checkpoint)
    assert engine.runner.cpu_decode is not None, "the default model on the CPU in float32 decodes through its kernels"
    checked = CheckedDecode(engine, engine.runner.cpu_decode)
    engine.runner.cpu_decode = checked
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    seeded = SamplingParams(temperature=0.9, top_p=0.9, seed=5, max_tokens=12, ignore_eos=True)
    for index, length in enumerate([3, 17, 40, 70, 9, 1]):  # prompts of several lengths: sequences of several lengths in a step
        engine.add_request(f"r{index}", [(31 * index + 7 * position) % 40000 + 100 for position in range(length)], seeded if index % 3 == 1 else greedy)
    outputs = run_until_done(engine)
    assert len(outputs) == 6
    assert len(checked.batches) >= 10 and max(checked.batches) >= 5 and min(checked.batches) < max(checked.batches)


def test_a_model_without_quantized_blocks_keeps_the_modules(tiny_checkpoint: Checkpoint) -> None:
    engine = EngineCore(EngineConfig(model="tiny-random", max_num_seqs=2, max_model_len=64), tiny_checkpoint)
    assert engine.runner.cpu_decode is None
    assert CpuDecode.of(engine.runner.model) is None
