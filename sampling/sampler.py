"""The sampler: one call turns a step's logits into sampled token ids."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sampling.batch import SamplingBatch


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor
    """[num_rows] int64, on the logits' device."""


class Sampler:
    def __call__(self, logits: torch.Tensor, rows: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        """Sample one token for each of ``rows``.

        logits: [num_rows, vocab] for the rows being sampled this step, in order.
        rows:   [num_rows] int64 indices into ``batch`` (the engine slots).
        """
        return SamplerOutput(sampled_token_ids=logits.argmax(dim=-1))
