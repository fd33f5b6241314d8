"""The sampler: one call turns a step's logits into sampled token ids (and logprobs).

Pipeline per step (each stage skipped when no occupied row uses it, decided on the
host from `SamplingBatch.uses`):

1. float32 logits (a copy only when masks edit them in place); raw logprobs if any row asks and mode is ``raw``
2. masks: ``allowed_token_ids``, ``bad_words``, ``min_tokens``; then ``logit_bias``
3. penalties (repetition / presence / frequency), DRY
4. all-greedy batch: argmax and return
5. temperature (greedy rows divided by 1), truncations, exponential-race draw
   (a Triton kernel on CUDA, the torch path otherwise)
6. ``torch.where(is_greedy, argmax, draw)``; the ids are recorded into the batch
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from sampling.batch import RowParams, SamplingBatch
from sampling.logprobs import LogprobsTensors, gather_logprobs
from sampling.ops.draw import draw
from sampling.ops.dry import apply_dry
from sampling.ops.masks import apply_allowed, apply_token_entries, check_some_token_left, slot_positions
from sampling.ops.penalties import apply_penalties
from sampling.ops.seeded_noise import row_keys, uniform
from sampling.ops.truncation import Candidates, apply_truncations, top_candidates, whole_vocab

LogprobsMode = Literal["raw", "processed"]
TRUNCATIONS = ("min_p", "top_k", "top_p", "typical_p", "top_n_sigma", "xtc")
DEFAULT_CANDIDATE_WIDTHS = (256, 4096)
XTC_COIN_TOKEN = -1
"""The XTC coin is the row's uniform noise at this (out-of-vocabulary) token id."""


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor
    """[num_rows] int64, on the logits' device."""
    logprobs: LogprobsTensors | None = None
    """When any occupied row asks for logprobs (rows that did not ask get them too; the engine drops them)."""


class Sampler:
    """Batched sampler.

    logprobs_mode: ``raw`` (default) reports logprobs of the model's logits before any
    processing; ``processed`` those of the distribution actually sampled from (after
    masks, penalties, temperature and truncation; greedy rows: after penalties).
    candidate_widths: candidate-set widths the torch path tries before a full sort.
    use_triton: None picks Triton kernels on CUDA devices and the torch path elsewhere.
    """

    def __init__(
        self,
        logprobs_mode: LogprobsMode = "raw",
        candidate_widths: tuple[int, ...] = DEFAULT_CANDIDATE_WIDTHS,
        use_triton: bool | None = None,
    ) -> None:
        if logprobs_mode not in ("raw", "processed"):
            raise ValueError(f"logprobs_mode must be 'raw' or 'processed', got {logprobs_mode!r}")
        self.logprobs_mode = logprobs_mode
        self.candidate_widths = candidate_widths
        self.use_triton = use_triton

    def __call__(self, logits: torch.Tensor, rows: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        """Sample one token for each of ``rows``.

        logits: [num_rows, vocab] for the rows being sampled this step, in order.
        rows:   [num_rows] int64 indices into ``batch`` (the engine slots), distinct.
        """
        in_place_masks = batch.uses["allowed"] > 0 or batch.uses["token_entries"] > 0
        logits = logits.to(torch.float32, copy=in_place_masks)  # the caller's logits are never modified
        rows = rows.to(logits.device)
        p = batch.gather(rows)
        want_logprobs = batch.uses["logprobs"] > 0
        raw = torch.log_softmax(logits, dim=-1) if want_logprobs and self.logprobs_mode == "raw" else None
        logits = _apply_masks(logits, rows, batch)
        logits = _apply_penalties(logits, rows, p, batch)
        token_ids = logits.argmax(dim=-1)
        processed = logits
        if batch.uses["random"] > 0:
            need_processed = want_logprobs and raw is None
            sampled, final = self._sample(logits / p.temperature[:, None], p, batch, need_processed)
            token_ids = torch.where(p.is_greedy, token_ids, sampled)
            if final is not None:
                processed = torch.where(p.is_greedy[:, None], logits, final)
        batch.record(rows, token_ids)
        if not want_logprobs:
            return SamplerOutput(token_ids)
        source = raw if raw is not None else torch.log_softmax(processed, dim=-1)
        return SamplerOutput(token_ids, gather_logprobs(source, token_ids, batch.max_logprobs()))

    def _sample(
        self, scaled: torch.Tensor, p: RowParams, batch: SamplingBatch, need_processed: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Truncate and draw: ([n] token ids, processed logits [n, V] or None)."""
        stages = frozenset(name for name in TRUNCATIONS if batch.uses[name] > 0)
        keys = row_keys(p.seed_key, p.has_seed, p.output_pos)
        if self._triton_enabled(scaled.device):
            from sampling.triton import triton_sample

            return triton_sample(scaled, p, keys, stages, need_processed)
        c = self._truncate(scaled, p, stages, keys, batch)
        return draw(c, keys), (_dense_logits(c, scaled.shape[1]) if need_processed else None)

    def _triton_enabled(self, device: torch.device) -> bool:
        return self.use_triton if self.use_triton is not None else device.type == "cuda"

    def _truncate(
        self, scaled: torch.Tensor, p: RowParams, stages: frozenset[str], keys: torch.Tensor, batch: SamplingBatch
    ) -> Candidates:
        """The torch path: truncations on the narrowest candidate set that covers every row."""
        if not stages:
            return whole_vocab(scaled)
        vocab = scaled.shape[1]
        coin = uniform(keys, torch.tensor([XTC_COIN_TOKEN], device=keys.device)).squeeze(1)
        if batch.uses["unbounded"] == 0:
            for width in sorted({max(w, batch.max_top_k()) for w in self.candidate_widths}):
                if width >= vocab:
                    break
                c = top_candidates(scaled, width)
                if bool(apply_truncations(c, p, stages, coin).all()):
                    return c
        c = top_candidates(scaled, vocab)
        apply_truncations(c, p, stages, coin)
        return c


def _apply_masks(logits: torch.Tensor, rows: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Stage 3 (and logit_bias, which shares the sparse entry table) in place on logits [n, V]."""
    if batch.uses["allowed"] > 0 and batch.allowed is not None:
        apply_allowed(logits, batch.allowed[rows])
    table = batch.entries.table() if batch.uses["token_entries"] > 0 else None
    if table is not None:
        positions = slot_positions(rows, batch.max_num_rows)
        apply_token_entries(logits, table, positions, batch.output_pos, batch.history, batch.history_len)
    if batch.uses["may_mask_all"] > 0:
        check_some_token_left(logits)
    return logits


def _apply_penalties(logits: torch.Tensor, rows: torch.Tensor, p: RowParams, batch: SamplingBatch) -> torch.Tensor:
    """Stage 4: repetition / presence / frequency penalties and DRY, logits [n, V] -> [n, V]."""
    if batch.uses["penalties"] > 0 and batch.prompt_mask is not None and batch.output_counts is not None:
        logits = apply_penalties(
            logits,
            batch.prompt_mask[rows],
            batch.output_counts[rows],
            p.repetition_penalty,
            p.presence_penalty,
            p.frequency_penalty,
        )
    if batch.uses["dry"] > 0 and batch.history is not None:
        assert batch.history_len is not None and batch.dry_breakers is not None
        logits = apply_dry(
            logits,
            batch.history[rows],
            batch.history_len[rows],
            batch.dry_breakers[rows],
            p.dry_multiplier,
            p.dry_base,
            p.dry_allowed_length,
            p.dry_penalty_last_n,
        )
    return logits


def _dense_logits(c: Candidates, vocab_size: int) -> torch.Tensor:
    """[n, V] logits of the kept candidates, -inf elsewhere."""
    kept = torch.where(c.keep, c.logits, torch.full_like(c.logits, float("-inf")))
    if c.ids is None:
        return kept
    return torch.full((kept.shape[0], vocab_size), float("-inf"), device=kept.device).scatter_(1, c.ids, kept)
