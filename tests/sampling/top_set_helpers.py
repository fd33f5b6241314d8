"""Run `top_set_sample` directly on a list of requests (CPU: the interpreter)."""

from __future__ import annotations

import torch

from sampling.batch import SamplingBatch
from sampling.features import TRUNCATIONS
from sampling.ops.seeded_noise import random_keys
from sampling.params import SamplingParams
from sampling.triton.top_set_launch import TopSetDraw, top_set_sample
from sampling.view import RowView


def run_top_set(params: list[SamplingParams], logits: torch.Tensor, blocks: tuple[int, int] | None = None) -> TopSetDraw:
    """Tokens and passes of requests ``params`` (every one seeded, or the keys are random) on logits [n, V]."""
    n, vocab = logits.shape
    batch = SamplingBatch(n, vocab, 8, logits.device)
    for row, p in enumerate(params):
        batch.add_request(row, p, [0])
    p = RowView.of(batch, torch.arange(n, device=logits.device)).params
    stages = frozenset(feature for feature in TRUNCATIONS if batch.uses[feature] > 0)
    return top_set_sample(logits, p, random_keys(n, logits.device), stages, blocks)
