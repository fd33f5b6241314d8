"""`SamplingBatch`: the persistent per-row sampling state of the engine's slots.

Rows are written when requests join or leave, never rebuilt per step. Per step the
sampler gathers the rows it samples (`gather`) and, after the draw, records the
sampled ids (`record`: one token per row, or a verify step's emitted tokens), which
updates output positions, token counts and the token history on the device, without
a host round trip.

The host also keeps, per `Feature`, how many occupied rows use it (`uses`), so the
sampler decides which stages to run without reading device tensors.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

import torch

from sampling.device_copy import copy_into, to_device, values_to_device
from sampling.features import Feature, row_features
from sampling.ops.masks import AllTokensMaskedError
from sampling.ops.seeded_noise import seed_key
from sampling.ops.segments import segment_rows
from sampling.params import SamplingParams
from sampling.token_entries import Entry, TokenEntries, entries_for
from sampling.tokenized import TokenizedStrings, has_strings

FLOAT_COLUMNS = (
    "temperature", "top_p", "min_p", "typical_p", "top_n_sigma", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "dry_multiplier", "dry_base", "xtc_threshold", "xtc_probability",
)  # fmt: skip
INT_COLUMNS = ("top_k", "seed_key", "min_tokens", "dry_allowed_length", "dry_penalty_last_n", "is_greedy", "has_seed")


@dataclass(frozen=True)
class RowParams:
    """This step's per-row parameters, each [num_rows] on the device (greedy rows have temperature 1)."""

    temperature: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    typical_p: torch.Tensor
    top_n_sigma: torch.Tensor
    presence_penalty: torch.Tensor
    frequency_penalty: torch.Tensor
    repetition_penalty: torch.Tensor
    dry_multiplier: torch.Tensor
    dry_base: torch.Tensor
    xtc_threshold: torch.Tensor
    xtc_probability: torch.Tensor
    top_k: torch.Tensor
    seed_key: torch.Tensor
    min_tokens: torch.Tensor
    dry_allowed_length: torch.Tensor
    dry_penalty_last_n: torch.Tensor
    is_greedy: torch.Tensor
    has_seed: torch.Tensor
    output_pos: torch.Tensor

    def take(self, rows: torch.Tensor) -> RowParams:
        """The parameters of ``rows`` ([n] int64 indices into these rows) only."""
        return RowParams(**{f.name: getattr(self, f.name)[rows] for f in dataclasses.fields(self)})


class SamplingBatch:
    """Sampling state for up to ``max_num_rows`` requests, one row per engine slot.

    eos_token_ids: banned (with ``stop_token_ids``) while a row has fewer than
    ``min_tokens`` outputs, unless the request sets ``ignore_eos``.
    """

    def __init__(
        self,
        max_num_rows: int,
        vocab_size: int,
        max_model_len: int,
        device: torch.device | str,
        eos_token_ids: tuple[int, ...] = (),
    ) -> None:
        self.max_num_rows = max_num_rows
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.device = torch.device(device)
        self.eos_token_ids = tuple(eos_token_ids)
        self.params: list[SamplingParams | None] = [None] * max_num_rows
        self.uses: Counter[Feature] = Counter()
        self._features: list[set[Feature]] = [set() for _ in range(max_num_rows)]
        with torch.inference_mode(False):  # updated in place, in and out of inference mode
            # One row per parameter, one column per slot: a step's gather gives each parameter contiguous.
            self._floats = torch.zeros(len(FLOAT_COLUMNS), max_num_rows, dtype=torch.float32, device=self.device)
            self._ints = torch.zeros(len(INT_COLUMNS), max_num_rows, dtype=torch.int64, device=self.device)
            self.output_pos = torch.zeros(max_num_rows, dtype=torch.int64, device=self.device)
        self._ones = torch.ones(max_num_rows, dtype=torch.int64, device=self.device)
        self.entries = TokenEntries(max_num_rows, self.device)
        # Lazily allocated when the first row needing them joins: [R, V] or [R, max_model_len].
        self.output_counts: torch.Tensor | None = None
        self.allowed: torch.Tensor | None = None
        self.history: torch.Tensor | None = None
        self.history_len: torch.Tensor | None = None
        self.dry_breaker_mask: torch.Tensor | None = None

    # ---- host-side summaries -------------------------------------------------------------------

    @property
    def argmax_only(self) -> bool:
        """Every occupied row takes the argmax of its raw logits: all are greedy, and none needs
        a mask, a logit edit, a penalty or logprobs (each of those is a feature in ``uses``)."""
        return not self.uses

    def max_top_k(self) -> int:
        """Largest enabled top_k among occupied sampling rows (0 if none)."""
        return max((p.top_k for p in self.params if p is not None and not p.is_greedy and p.top_k > 0), default=0)

    def max_logprobs(self) -> int:
        """Largest ``logprobs`` among occupied rows (0 if none asks; check ``uses[Feature.LOGPROBS]``)."""
        return max((p.logprobs for p in self.params if p is not None and p.logprobs), default=0)

    # ---- join / leave ---------------------------------------------------------------------------

    def add_request(
        self,
        row: int,
        params: SamplingParams,
        prompt_token_ids: list[int],
        strings: TokenizedStrings | None = None,
    ) -> None:
        """Occupy ``row`` with a new request; ``strings``: its bad words and DRY breakers as ids
        (None: it has none, see `has_strings`)."""
        strings = _require_strings(params, strings)
        entries = self._checked_entries(params, strings)
        if self.params[row] is not None:
            self.remove_request(row)
        features = row_features(params)
        if entries:
            features.add(Feature.TOKEN_ENTRIES)
        if any(e.prefix for e in entries):
            features.add(Feature.HISTORY)
            if params.allowed_token_ids is not None:
                features.add(Feature.MAY_MASK_ALL)
        if Feature.DRY in features or Feature.PENALTIES in features:
            features.add(Feature.HISTORY)
        self.params[row] = params
        self._features[row] = features
        self.uses.update(features)
        self._write_columns(row, params)
        self.entries.set_row(row, entries)
        self._write_dense_state(row, params, prompt_token_ids, features, strings.dry_breakers)

    def validate(self, params: SamplingParams, strings: TokenizedStrings | None = None) -> None:
        """Raise a ``ValueError`` naming the field if ``params`` cannot be sampled by this batch
        (a token id outside the vocabulary, every allowed token banned); `add_request` checks the same."""
        self._checked_entries(params, _require_strings(params, strings))

    def _checked_entries(self, params: SamplingParams, strings: TokenizedStrings) -> list[Entry]:
        params.check_vocab(self.vocab_size)
        strings.check_vocab(self.vocab_size)
        entries = entries_for(params, self.eos_token_ids, strings)
        self._check_not_all_masked(params, entries)
        return entries

    def remove_request(self, row: int) -> None:
        """Free ``row``; its device rows are overwritten by the next request to join it."""
        if self.params[row] is None:
            return
        self.uses.subtract(self._features[row])
        self.uses = +self.uses
        self._features[row] = set()
        self.entries.set_row(row, [])
        self.params[row] = None

    def _check_not_all_masked(self, params: SamplingParams, entries: list[Entry]) -> None:
        if params.allowed_token_ids is None:
            return
        always_banned = {e.token for e in entries if e.value == float("-inf") and not e.prefix}
        if set(params.allowed_token_ids) <= always_banned:
            raise AllTokensMaskedError("allowed_token_ids: every allowed token is banned by bad_words or by min_tokens (stop/EOS ids)")

    def _write_columns(self, row: int, params: SamplingParams) -> None:
        greedy = params.is_greedy
        floats = [1.0 if greedy and name == "temperature" else float(getattr(params, name)) for name in FLOAT_COLUMNS]
        ints = {
            "top_k": max(params.top_k, 0),
            "seed_key": seed_key(params.seed) if params.seed is not None else 0,
            "min_tokens": params.min_tokens,
            "dry_allowed_length": params.dry_allowed_length,
            "dry_penalty_last_n": params.dry_penalty_last_n,
            "is_greedy": int(greedy),
            "has_seed": int(params.seed is not None),
        }
        copy_into(self._floats[:, row], torch.tensor(floats, dtype=torch.float32))
        copy_into(self._ints[:, row], torch.tensor([ints[name] for name in INT_COLUMNS], dtype=torch.int64))
        self.output_pos[row].fill_(0)

    def _allocate(self, features: set[Feature]) -> None:
        """Allocate the [R, V] / [R, max_model_len] state the first time a row needs it.

        Allocated outside inference mode, so later in-place updates work in and out of it.
        """
        R, V, dev = self.max_num_rows, self.vocab_size, self.device
        with torch.inference_mode(False):
            if Feature.PENALTIES in features and self.output_counts is None:
                self.output_counts = torch.zeros(R, V, dtype=torch.int32, device=dev)
            if Feature.ALLOWED in features and self.allowed is None:
                self.allowed = torch.ones(R, V, dtype=torch.bool, device=dev)
            if Feature.HISTORY in features and self.history is None:
                self.history = torch.full((R, self.max_model_len), -1, dtype=torch.int64, device=dev)
                self.history_len = torch.zeros(R, dtype=torch.int64, device=dev)
            if Feature.DRY in features and self.dry_breaker_mask is None:
                self.dry_breaker_mask = torch.zeros(R, V, dtype=torch.bool, device=dev)

    def _write_dense_state(
        self,
        row: int,
        params: SamplingParams,
        prompt: list[int],
        features: set[Feature],
        dry_breakers: tuple[int, ...],
    ) -> None:
        """Reset ``row`` in every allocated dense tensor (rows of earlier requests may be stale). By fills
        and index fills: ``tensor[row] = value`` copies a host scalar, which on CUDA waits for the device."""
        self._allocate(features)
        prompt_ids = values_to_device(prompt, torch.int64, self.device)
        if self.output_counts is not None:
            self.output_counts[row].fill_(0)
        if self.allowed is not None:
            self.allowed[row].fill_(params.allowed_token_ids is None)
            if params.allowed_token_ids is not None:
                self.allowed[row].index_fill_(0, values_to_device(params.allowed_token_ids, torch.int64, self.device), True)
        if self.history is not None and self.history_len is not None:
            n = min(len(prompt), self.max_model_len)
            self.history[row].fill_(-1)
            self.history[row, :n] = prompt_ids[:n]
            self.history_len[row].fill_(n)
        if self.dry_breaker_mask is not None:
            self.dry_breaker_mask[row].fill_(False)
            self.dry_breaker_mask[row].index_fill_(0, values_to_device(dry_breakers, torch.int64, self.device), True)

    # ---- per step -------------------------------------------------------------------------------

    def gather(self, rows: torch.Tensor) -> RowParams:
        """Per-row parameters of ``rows`` ([n] int64 slot indices), each [n]."""
        floats = self._floats[:, rows]  # [len(FLOAT_COLUMNS), n]: each parameter's values contiguous, as kernels read them
        ints = self._ints[:, rows]
        values = {name: floats[i] for i, name in enumerate(FLOAT_COLUMNS)}
        values |= {name: ints[i] for i, name in enumerate(INT_COLUMNS)}
        values["is_greedy"] = values["is_greedy"].bool()
        values["has_seed"] = values["has_seed"].bool()
        return RowParams(**values, output_pos=self.output_pos[rows])

    def record_argmax(self, rows: torch.Tensor) -> None:
        """`record` for an `argmax_only` batch, whose every row got a token (an argmax) and reads
        nothing but its output position: one launch. (The counts and history a row of an earlier
        request kept are reset when a request that reads them joins the row.)"""
        assert self.argmax_only
        self.output_pos.index_add_(0, rows, self._ones[: rows.shape[0]])

    def record(self, rows: torch.Tensor, token_ids: torch.Tensor, cu_num_rows: torch.Tensor | None = None) -> None:
        """Account generated ``token_ids`` for ``rows`` ([n] distinct slots), on device.

        Without ``cu_num_rows`` each slot gets one token (token_ids [n]). With it ([n+1] int64),
        slot ``rows[i]`` gets ``token_ids[cu[i]:cu[i+1]]`` in order, -1 marking the rows after its
        last token (a verify step).
        """
        if cu_num_rows is None:
            slots, offsets = rows, None
        else:
            request, offsets = segment_rows(to_device(cu_num_rows, rows.device), token_ids.shape[0])
            slots = rows[request]
        emitted = token_ids >= 0
        self.output_pos.index_add_(0, slots, emitted.to(torch.int64))
        if self.output_counts is not None:
            ones = emitted.to(self.output_counts.dtype)
            self.output_counts.index_put_((slots, token_ids.clamp(min=0)), ones, accumulate=True)
        if self.history is not None and self.history_len is not None:
            # Written as a difference added at the row's position, so that rows that write nothing (after
            # the last token, or past max_model_len, which the engine never reaches) add 0 wherever they land.
            position = self.history_len[slots] if offsets is None else self.history_len[slots] + offsets
            writes = emitted & (position < self.max_model_len)
            index = (slots, position.clamp(max=self.max_model_len - 1))
            change = torch.where(writes, token_ids - self.history[index], torch.zeros_like(token_ids))
            self.history.index_put_(index, change, accumulate=True)
            self.history_len.index_add_(0, slots, emitted.to(torch.int64))
            self.history_len.clamp_(max=self.max_model_len)


def _require_strings(params: SamplingParams, strings: TokenizedStrings | None) -> TokenizedStrings:
    if strings is not None:
        return strings
    if has_strings(params):
        raise ValueError("bad_words and DRY need the request's TokenizedStrings (sampling.tokenized.tokenize_strings)")
    return TokenizedStrings()
