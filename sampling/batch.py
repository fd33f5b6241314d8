"""`SamplingBatch`: the persistent per-row sampling state of the engine's slots."""

from __future__ import annotations

from collections.abc import Callable

import torch

from sampling.params import SamplingParams


class SamplingBatch:
    """Sampling state for up to ``max_num_rows`` requests, one row per engine slot.

    Rows are updated when requests join or leave, never rebuilt per step.
    """

    def __init__(
        self,
        max_num_rows: int,
        vocab_size: int,
        max_model_len: int,
        device: torch.device,
        eos_token_ids: tuple[int, ...] = (),
    ) -> None:
        self.max_num_rows = max_num_rows
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.device = device
        self.params: list[SamplingParams | None] = [None] * max_num_rows

    def add_request(
        self,
        row: int,
        params: SamplingParams,
        prompt_token_ids: list[int],
        encode: Callable[[str], list[int]] | None = None,
    ) -> None:
        """Occupy ``row`` with a new request. ``encode`` turns strings (bad words) into token ids."""
        self.params[row] = params

    def remove_request(self, row: int) -> None:
        self.params[row] = None
