"""The sampler: one call turns a step's logits into sampled token ids (and logprobs).

`Sampler.__call__` samples one token per request; `Sampler.verify` verifies drafted
tokens (speculative decoding) with k+1 rows per request, each processed as if the
drafts before it had been generated (`RowView`), so the emitted tokens are distributed
exactly as non-speculative sampling's. Both run the same pipeline on a `RowView`.

The pipeline's six stages, numbered as in ``sampling/README.md`` ("The pipeline"), each skipped when no
occupied row uses it (`SamplingBatch.uses`, counted per `Feature` on the host): 1 float32 logits and raw
logprobs (`_run`), 2 masks (`_apply_masks`), 3 penalties (`_apply_penalties`), 4 the all-greedy argmax,
5 temperature, truncation and draw (`_draw`), 6 greedy or drawn per row (`_sample_penalised`).

Verify replaces the draw by accept-or-recover (`sampling.ops.rejection`; greedy rows
accept a draft equal to the argmax), then keeps each request's rows up to its first
rejection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from sampling.batch import RowParams, SamplingBatch
from sampling.device_copy import to_device
from sampling.features import TRUNCATIONS, Feature
from sampling.logprobs import LogprobsTensors, gather_logprobs
from sampling.ops.draw import Draw, draw, whole_vocab_race
from sampling.ops.dry import apply_dry
from sampling.ops.masks import GrammarMask, apply_allowed, apply_grammar_mask, apply_token_entries, check_some_token_left, rows_left_empty
from sampling.ops.penalties import apply_penalties, seen_tokens
from sampling.ops.rejection import accept_or_recover, first_rejection
from sampling.ops.seeded_noise import random_keys, row_keys, uniform
from sampling.ops.segments import max_rows_bound
from sampling.ops.top_tokens import ScaledLogits, block_maxima, first_argmax, scaled_logits
from sampling.ops.truncation import Candidates, apply_truncations, top_candidates, whole_vocab
from sampling.view import RowView

LogprobsMode = Literal["raw", "processed"]
DEFAULT_CANDIDATE_WIDTHS = (128, 512, 4096)
XTC_COIN_TOKEN = -1
"""The XTC coin is the row's uniform noise at this (out-of-vocabulary) token id."""


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor
    """[num_rows] int64, on the logits' device; -1 at a row left with no token to sample (a constrained row's
    masks left none, or the penalties left every logit -inf, or one +inf)."""
    logprobs: LogprobsTensors | None = None
    """When any occupied row asks for logprobs (rows that did not ask get them too; the engine drops them)."""


@dataclass
class VerifyOutput:
    token_ids: torch.Tensor
    """[num_rows] int64: the token emitted at each row; -1 at the rows after a request's first rejection."""
    num_emitted: torch.Tensor
    """[n] int64: tokens emitted per request, 1 to k_i + 1."""
    logprobs: LogprobsTensors | None = None
    """Per row, of the token emitted there (rows with -1: of token 0), as `Sampler.__call__` would report them."""


@dataclass
class _Rows:
    """Per-row results of the pipeline on a `RowView`."""

    token_ids: torch.Tensor
    """[N] what each row emits if reached (with drafts: the draft when accepted)."""
    accepted: torch.Tensor | None
    """[N] bool with drafts: the row's draft is accepted."""
    logprobs: torch.Tensor | None
    """[N, V] normalised logprobs to report (raw or processed), when any row asks."""


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
        self._workspace: torch.Tensor | None = None

    def __call__(self, logits: torch.Tensor, rows: torch.Tensor, batch: SamplingBatch, grammar: GrammarMask | None = None) -> SamplerOutput:
        """Sample one token for each of ``rows``.

        logits: [num_rows, vocab] for the rows being sampled this step, in order.
        rows:   [num_rows] int64 indices into ``batch`` (the engine slots), distinct.
        grammar: the bitmasks of the rows whose requests have ``structured_outputs`` (each such row needs one).
        """
        rows = rows.to(logits.device)
        if batch.argmax_only and grammar is None:  # no row's parameters are needed: one reduction and the record
            logits = logits.float()
            return self.record_argmax(first_argmax(logits, _cpu_block_maxima(logits)), rows, batch)
        out = self._run(logits, RowView.of(batch, rows), grammar)
        batch.record(rows, out.token_ids)
        return SamplerOutput(out.token_ids, self._logprobs(out.logprobs, out.token_ids, batch))

    def record_argmax(self, token_ids: torch.Tensor, rows: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        """`__call__`'s output for a batch that is `SamplingBatch.argmax_only`, when the caller took
        the argmax itself (`LlamaForCausalLM.argmax_logits`, without the logits): token_ids [n]."""
        batch.record_argmax(rows.to(token_ids.device))
        return SamplerOutput(token_ids, None)

    def verify(
        self,
        logits: torch.Tensor,
        rows: torch.Tensor,
        draft_token_ids: torch.Tensor,
        cu_num_rows: torch.Tensor,
        batch: SamplingBatch,
        grammar: GrammarMask | None = None,
    ) -> VerifyOutput:
        """Verify drafted tokens exactly: the emitted tokens are distributed as non-speculative sampling's.

        logits: [num_rows, vocab] raw target logits; request ``i`` owns rows ``cu[i]:cu[i+1]``, row ``cu[i] + j``
        scoring the position after the drafts ``cu[i]:cu[i] + j``.
        rows: [n] int64 distinct slots of ``batch``.
        draft_token_ids: [num_rows] int64, the draft verified at each row; -1 at each request's last row.
        cu_num_rows: [n+1] int64; on the host it gives the exact longest request (sizing the draft-prefix
        gathers of penalties and token masks), on the device a bound (num_rows - n + 1) that needs no sync.
        Each request emits its accepted drafts, then the token drawn at its first rejection (or the
        bonus token after k accepted drafts); ``batch`` records them. ``grammar``: a bitmask for every
        row of each constrained request, row ``cu[i] + j`` the grammar's state after its drafts before it.
        """
        rows, drafts, cu = (to_device(t, logits.device) for t in (rows, draft_token_ids, cu_num_rows))
        view = RowView.of(batch, rows).with_drafts(drafts, cu, max_rows_bound(cu_num_rows, logits.shape[0]))
        out = self._run(logits, view, grammar)
        assert out.accepted is not None
        token_ids, num_emitted = first_rejection(out.token_ids, out.accepted, view.first_rows, view.requests, rows.shape[0])
        batch.record(rows, token_ids, cu)
        return VerifyOutput(token_ids, num_emitted, self._logprobs(out.logprobs, token_ids, batch))

    def _run(self, logits: torch.Tensor, view: RowView, grammar: GrammarMask | None) -> _Rows:
        """The pipeline on ``view``'s rows: logits [N, V] -> per-row tokens (and acceptance, with drafts)."""
        batch = view.batch
        in_place = batch.uses[Feature.ALLOWED] > 0 or batch.uses[Feature.TOKEN_ENTRIES] > 0 or batch.uses[Feature.PENALTIES] > 0 or grammar is not None
        logits = self._private_copy(logits) if in_place else logits.float()  # the caller's logits are never modified
        want_logprobs = batch.uses[Feature.LOGPROBS] > 0
        raw = torch.log_softmax(logits, dim=-1) if want_logprobs and self.logprobs_mode == "raw" else None
        if grammar is not None:
            apply_grammar_mask(logits, grammar)
        logits = _apply_masks(logits, view)
        dead = rows_left_empty(logits, grammar.rows) if grammar is not None else None
        maxima = None
        if batch.uses[Feature.PENALTIES] > 0 or batch.uses[Feature.DRY] > 0:
            logits = _apply_penalties(logits, view)
            maxima = _cpu_block_maxima(logits)
            dead = _with_rows_left_unsampleable(logits, maxima, dead)
        if dead is None:
            return self._sample_penalised(logits, view, raw, maxima)
        out = self._sample_penalised(logits.masked_fill(dead[:, None], 0.0), view, raw)  # a dead row's draw is discarded
        accepted = None if out.accepted is None else out.accepted & ~dead
        return _Rows(out.token_ids.masked_fill(dead, -1), accepted, out.logprobs)

    def _sample_penalised(self, logits: torch.Tensor, view: RowView, raw: torch.Tensor | None, maxima: torch.Tensor | None = None) -> _Rows:
        """The rest of the pipeline on logits [N, V] after masks and penalties; ``raw``: the raw logprobs, when
        reported; ``maxima``: their `block_maxima` when already known."""
        batch, p = view.batch, view.params
        want_logprobs = batch.uses[Feature.LOGPROBS] > 0
        need_processed = want_logprobs and raw is None
        if batch.uses[Feature.RANDOM] > 0 and self._triton_enabled(logits.device) and _top_set_rows(view, need_processed):
            from sampling.triton.top_set_launch import top_set_sample

            # One launch for every row: greedy rows get their argmax there, the others never pay for one.
            drawn = top_set_sample(logits, p, random_keys(logits.shape[0], logits.device), _stages(batch))
            return _Rows(drawn.token_ids, None, raw)
        if maxima is None:
            maxima = _cpu_block_maxima(logits)
        token_ids = first_argmax(logits, maxima)
        accepted = None if view.drafts is None else view.drafts == token_ids
        processed = logits
        if batch.uses[Feature.RANDOM] > 0:
            drawn = self._draw(logits, maxima, view, need_processed)
            token_ids = torch.where(p.is_greedy, token_ids, drawn.token_ids)
            if accepted is not None and drawn.accepted is not None:
                accepted = torch.where(p.is_greedy, accepted, drawn.accepted)
            if drawn.processed is not None:
                processed = torch.where(p.is_greedy[:, None], logits, drawn.processed)
        if not want_logprobs:
            return _Rows(token_ids, accepted, None)
        return _Rows(token_ids, accepted, raw if raw is not None else torch.log_softmax(processed, dim=-1))

    @staticmethod
    def _logprobs(source: torch.Tensor | None, token_ids: torch.Tensor, batch: SamplingBatch) -> LogprobsTensors | None:
        """The logprobs of ``token_ids`` (-1: of token 0) from ``source``, when logprobs are reported."""
        return None if source is None else gather_logprobs(source, token_ids.clamp(min=0), batch.max_logprobs())

    def _draw(self, logits: torch.Tensor, maxima: torch.Tensor | None, view: RowView, need_processed: bool) -> Draw:
        """Temperature, truncate and draw (with drafts: accept or recover) on logits [N, V];
        maxima: their `block_maxima` (or None)."""
        p, batch = view.params, view.batch
        stages = _stages(batch)
        keys = row_keys(p.seed_key, p.has_seed, p.output_pos)
        if self._triton_enabled(logits.device):
            from sampling.triton import triton_sample

            return triton_sample(logits / p.temperature[:, None], p, keys, stages, need_processed, view.drafts)
        if not stages and view.drafts is None and not need_processed:
            return Draw(whole_vocab_race(logits, p.temperature, keys), None, None)
        if not stages:
            c = whole_vocab(logits / p.temperature[:, None])
            return _draw_candidates(c, keys, view.drafts, logits.shape[1], need_processed)
        coin = uniform(keys, torch.full((1,), XTC_COIN_TOKEN, dtype=torch.int64, device=keys.device)).squeeze(1)
        rows = _Truncation(scaled_logits(logits, p.temperature, maxima), p, keys, coin, view.drafts)
        return _truncate_and_draw(rows, stages, self._widths(batch, logits.shape[1]), need_processed)

    def _private_copy(self, logits: torch.Tensor) -> torch.Tensor:
        """float32 logits [N, V] that the stages may edit in place: a copy into this sampler's
        workspace, which is reused from step to step (a fresh [N, V] tensor costs page faults
        every step on the CPU). Nothing the sampler returns refers to it."""
        if logits.dtype != torch.float32:
            return logits.float()
        numel = logits.numel()
        if self._workspace is None or self._workspace.numel() < numel or self._workspace.device != logits.device:
            with torch.inference_mode(False):  # edited in place, in and out of inference mode
                self._workspace = torch.empty(numel, dtype=torch.float32, device=logits.device)
        return self._workspace[:numel].view(logits.shape).copy_(logits)

    def _triton_enabled(self, device: torch.device) -> bool:
        return self.use_triton if self.use_triton is not None else device.type == "cuda"

    def _widths(self, batch: SamplingBatch, vocab: int) -> list[int]:
        """The candidate-set widths the torch path tries, ending with ``vocab`` (a full sort)."""
        if batch.uses[Feature.UNBOUNDED] > 0:
            return [vocab]
        # One candidate past the largest top_k, to see whether a tie at the k-th value goes on.
        widths = {max(w, batch.max_top_k() + 1) for w in self.candidate_widths}
        return sorted(w for w in widths if w < vocab) + [vocab]


@dataclass(frozen=True)
class _Truncation:
    """What the torch path truncates and draws from, for N rows (each tensor [N] unless stated)."""

    scaled: ScaledLogits
    params: RowParams
    keys: torch.Tensor
    coin: torch.Tensor
    """XTC's per-row chance."""
    drafts: torch.Tensor | None

    def take(self, rows: torch.Tensor) -> _Truncation:
        """The same for ``rows`` ([n] int64) only."""
        drafts = None if self.drafts is None else self.drafts[rows]
        return _Truncation(self.scaled.take(rows), self.params.take(rows), self.keys[rows], self.coin[rows], drafts)


def _truncate_and_draw(t: _Truncation, stages: frozenset[Feature], widths: list[int], need_processed: bool) -> Draw:
    """The torch path: truncate (``stages``, not empty) on the narrowest of ``widths`` whose candidate set
    covers each row (a row not covered retries alone on the next width; the last is the whole vocabulary), then draw."""
    c = top_candidates(t.scaled, widths[0])
    covered = apply_truncations(c, t.params, stages, t.coin)
    drawn = _draw_candidates(c, t.keys, t.drafts, t.scaled.logits.shape[1], need_processed)
    if len(widths) == 1 or bool(covered.all()):
        return drawn
    rest = (~covered).nonzero().squeeze(1)
    return drawn.with_rows(rest, _truncate_and_draw(t.take(rest), stages, widths[1:], need_processed))


def _stages(batch: SamplingBatch) -> frozenset[Feature]:
    """The truncations some occupied row of ``batch`` uses."""
    return frozenset(feature for feature in TRUNCATIONS if batch.uses[feature] > 0)


def _top_set_rows(view: RowView, need_processed: bool) -> bool:
    """Whether `top_set_sample` draws these rows: no drafts, no processed logits, only min-p / top-k / top-p."""
    from sampling.triton.top_set_launch import TOP_SET_STAGES

    return view.drafts is None and not need_processed and _stages(view.batch) <= TOP_SET_STAGES


def _draw_candidates(c: Candidates, keys: torch.Tensor, drafts: torch.Tensor | None, vocab: int, need_processed: bool) -> Draw:
    """Draw (with drafts: accept or recover) from the kept candidates of rows over ``vocab`` tokens; keys [N] their noise keys."""
    processed = _dense_logits(c, vocab) if need_processed else None
    if drafts is None:
        return Draw(draw(c, keys), None, processed)
    token_ids, accepted = accept_or_recover(c, drafts, keys)
    return Draw(token_ids, accepted, processed)


def _cpu_block_maxima(logits: torch.Tensor) -> torch.Tensor | None:
    """`block_maxima` of logits [N, V] on the CPU, where they make the argmax and the truncations cheaper; None elsewhere."""
    return block_maxima(logits) if logits.device.type == "cpu" else None


def _apply_masks(logits: torch.Tensor, view: RowView) -> torch.Tensor:
    """Stage 2 but the grammar bitmask: allowed ids, bad words and ``min_tokens`` bans, and logit_bias (which shares
    the sparse entry table), in place on logits [N, V]."""
    batch = view.batch
    if batch.uses[Feature.ALLOWED] > 0 and batch.allowed is not None:
        apply_allowed(logits, view.allowed())
    tables = batch.entries.tables() if batch.uses[Feature.TOKEN_ENTRIES] > 0 else []
    for table in tables:
        last_outputs = view.last_outputs(table.prefix.shape[1]) if table.has_prefix else None
        apply_token_entries(logits, table, view.rows_of_slots(table.slot), view.params.output_pos, last_outputs)
    if batch.uses[Feature.MAY_MASK_ALL] > 0:
        check_some_token_left(logits)
    return logits


def _apply_penalties(logits: torch.Tensor, view: RowView) -> torch.Tensor:
    """Stage 3: repetition / presence / frequency penalties (in place) and DRY, logits [N, V] -> [N, V]."""
    batch, p = view.batch, view.params
    if batch.uses[Feature.PENALTIES] > 0 and batch.output_counts is not None:
        seen = seen_tokens(view.history())
        counts = view.output_counts_at(seen.clamp(min=0))
        apply_penalties(logits, seen, counts, p.repetition_penalty, p.presence_penalty, p.frequency_penalty)
    if batch.uses[Feature.DRY] > 0 and batch.history is not None:
        logits = _apply_dry_rows(logits, view)
    return logits


def _with_rows_left_unsampleable(logits: torch.Tensor, maxima: torch.Tensor | None, dead: torch.Tensor | None) -> torch.Tensor | None:
    """``dead`` ([N] bool or None) with the rows the penalties left nothing to draw by: every logit -inf
    (DRY or an infinite repetition penalty on the only tokens the masks left), or one +inf (a
    repetition penalty under float32's range divides by 0). Reads one bool on the host, only on
    steps with penalties; ``maxima``: the logits' `block_maxima`, when known."""
    row_maxima = (maxima if maxima is not None else logits).amax(dim=-1)
    unsampleable = ~torch.isfinite(row_maxima)
    if not bool(unsampleable.any()):
        return dead
    return unsampleable if dead is None else dead | unsampleable


def _apply_dry_rows(logits: torch.Tensor, view: RowView) -> torch.Tensor:
    """DRY on logits [N, V], computed only for the rows that use it, so that one request with DRY
    does not make every row of the step pay for its [L, MAX_MATCH] matching.

    The host bounds their number (``uses[Feature.DRY]`` requests, ``max_rows_per_request`` rows each);
    the device puts them first (a stable sort, no sync). Extra rows picked up have no DRY and get
    no penalty.
    """
    p = view.params
    num_rows = min(logits.shape[0], view.batch.uses[Feature.DRY] * view.max_rows_per_request)
    uses = (p.dry_multiplier > 0) & (p.dry_penalty_last_n != 0)
    rows = torch.argsort((~uses).to(torch.int8), stable=True)[:num_rows]
    penalised = apply_dry(
        logits[rows],
        view.history()[rows],
        view.history_len()[rows],
        view.dry_breaker_mask(rows),
        p.dry_multiplier[rows],
        p.dry_base[rows],
        p.dry_allowed_length[rows],
        p.dry_penalty_last_n[rows],
    )
    return logits.index_copy(0, rows, penalised)


def _dense_logits(c: Candidates, vocab_size: int) -> torch.Tensor:
    """[n, V] logits of the kept candidates, -inf elsewhere."""
    kept = torch.where(c.keep, c.logits, torch.full_like(c.logits, float("-inf")))
    if c.ids is None:
        return kept
    return torch.full((kept.shape[0], vocab_size), float("-inf"), device=kept.device).scatter_(1, c.ids, kept)
