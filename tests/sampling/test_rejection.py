"""`Sampler.verify`, deterministic properties: no drafts equals `__call__`; each row sees the drafts before it;
greedy rows accept exactly the argmax prefix; the batched record; logprobs of the emitted tokens."""

from __future__ import annotations

import pytest
import torch
from sampling_helpers import char_encode, verify_layout

from sampling.batch import SamplingBatch
from sampling.ops.segments import max_rows_bound
from sampling.params import SamplingParams
from sampling.sampler import Sampler
from sampling.tokenized import TokenizedStrings, tokenize_strings
from sampling.view import RowView

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
VOCAB = 16
EOS = 2
PROMPT = [1, 3, 1, 3]
PATHS = pytest.mark.parametrize("use_triton", [False, True], ids=["torch", "triton"])
PATHS_AND_MODES = pytest.mark.parametrize(
    "use_triton, mode", [(False, "raw"), (False, "processed"), (True, "processed")], ids=["torch-raw", "torch-processed", "triton"]
)
"""Raw logprobs are computed before the kernel runs, so the kernel is checked in processed mode only."""

MIXED = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.0, repetition_penalty=1.5, frequency_penalty=0.5, logprobs=3),
    SamplingParams(top_k=4, min_p=0.05),
    SamplingParams(seed=7, top_p=0.8, presence_penalty=0.6),
    SamplingParams(seed=8, dry_multiplier=1.0, dry_allowed_length=1, dry_sequence_breakers=["z"]),
    SamplingParams(seed=9, bad_words=["ad", "c"], min_tokens=3, stop_token_ids=[5], logit_bias={6: 2.0}),
    SamplingParams(seed=10, allowed_token_ids=[1, 3, 4, 6, 9], typical_p=0.8, top_n_sigma=1.5),
    SamplingParams(seed=11, xtc_probability=0.7, xtc_threshold=0.1, temperature=1.3, logprobs=2),
    SamplingParams(temperature=0.7, repetition_penalty=1.3, bad_words=["de"]),
]
"""One row per feature family: greedy, unseeded, seeded, penalties, DRY, bad words, min_tokens, bias, allowlist, truncations."""
DRAFTS = [[5, 5], [3, 1, 3], [], [7, 7, 7, 7], [7, 8, 7, 8], [1, 4, 4, EOS], [1, 9, 3], [0, 12, 0], [13, 14, 15]]
"""Drafts per MIXED row: repeats (penalties; DRY: 7 8 7 penalises 8), a completed bad word ("ad" = 1, 4),
EOS before and after min_tokens."""


encode = char_encode(VOCAB)


def make_batch(params: list[SamplingParams], vocab: int = VOCAB) -> SamplingBatch:
    batch = SamplingBatch(len(params), vocab, 64, DEVICE, eos_token_ids=(EOS,))
    for row, p in enumerate(params):
        batch.add_request(row, p, PROMPT, tokenize_strings(p, encode))
    return batch


def random_logits(rows: int, seed: int, vocab: int = VOCAB, scale: float = 2.0) -> torch.Tensor:
    return (torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * scale).to(DEVICE)


def verify(sampler: Sampler, logits: torch.Tensor, drafts: list[list[int]], batch: SamplingBatch, rows: list[int] | None = None):
    draft_ids, cu = verify_layout(drafts)
    slots = torch.tensor(rows if rows is not None else list(range(len(drafts))), device=DEVICE)
    return sampler.verify(logits, slots, draft_ids.to(DEVICE), cu.to(DEVICE), batch)


def assert_same_state(a: SamplingBatch, b: SamplingBatch) -> None:
    for name in ("output_pos", "output_counts", "history", "history_len"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def dense(top_ids: torch.Tensor, top_logprobs: torch.Tensor) -> torch.Tensor:
    """[V] logprobs from a full top-V list."""
    return torch.full((VOCAB,), float("-inf")).scatter_(0, top_ids.cpu(), top_logprobs.cpu())


@PATHS_AND_MODES
def test_verify_without_drafts_equals_call(use_triton: bool, mode: str) -> None:
    """k_i = 0 for every request: the same tokens (seeded and unseeded), logprobs and batch state as `__call__`."""
    sampler = Sampler(logprobs_mode=mode, use_triton=use_triton)
    plain, verified = make_batch(MIXED), make_batch(MIXED)
    rows = torch.arange(len(MIXED), device=DEVICE)
    for step in range(3):
        logits = random_logits(len(MIXED), seed=step)
        torch.manual_seed(step)
        expected = sampler(logits, rows, plain)
        torch.manual_seed(step)
        got = verify(sampler, logits, [[]] * len(MIXED), verified)
        assert torch.equal(got.token_ids, expected.sampled_token_ids)
        assert got.num_emitted.tolist() == [1] * len(MIXED)
        for name in ("top_ids", "top_logprobs", "token_logprobs", "token_ranks"):
            assert torch.equal(getattr(got.logprobs, name), getattr(expected.logprobs, name)), name
    assert_same_state(plain, verified)


@PATHS_AND_MODES
def test_each_row_is_scored_after_the_drafts_before_it(use_triton: bool, mode: str) -> None:
    """Row j's logprobs (every transform) equal `__call__`'s after recording d_0..d_{j-1}; so do the emitted token's."""
    params = [p.model_copy(update={"logprobs": VOCAB}) for p in MIXED]
    sampler = Sampler(logprobs_mode=mode, use_triton=use_triton)
    num_rows = sum(len(d) + 1 for d in DRAFTS)
    logits = random_logits(num_rows, seed=1)
    out = verify(sampler, logits, DRAFTS, make_batch(params))
    row = 0
    for p, drafts in zip(params, DRAFTS):
        for j in range(len(drafts) + 1):
            reference = make_batch([p])
            for token in drafts[:j]:
                reference.record(torch.tensor([0], device=DEVICE), torch.tensor([token], device=DEVICE))
            expected = sampler(logits[row : row + 1], torch.tensor([0], device=DEVICE), reference).logprobs
            want = dense(expected.top_ids[0], expected.top_logprobs[0])
            torch.testing.assert_close(dense(out.logprobs.top_ids[row], out.logprobs.top_logprobs[row]), want)
            token = int(out.token_ids[row])
            if token >= 0:
                assert float(out.logprobs.token_logprobs[row]) == pytest.approx(float(want[token]), abs=1e-5)
                assert int(out.logprobs.token_ranks[row]) == 1 + int((want > want[token]).sum())
            row += 1


def test_greedy_rows_accept_exactly_the_argmax_prefix() -> None:
    logits = random_logits(12, seed=2)
    top = logits.argmax(dim=-1).tolist()
    wrong = [(t + 1) % VOCAB for t in top]
    drafts = [top[0:3], [top[4], wrong[5], top[6]], [], [wrong[9], top[10]]]  # rows 0-3, 4-7, 8, 9-11
    batch = make_batch([SamplingParams(temperature=0.0)] * 4)
    out = verify(Sampler(), logits, drafts, batch)
    assert out.token_ids.tolist() == [*top[0:4], top[4], top[5], -1, -1, top[8], top[9], -1, -1]
    assert out.num_emitted.tolist() == [4, 2, 1, 1]
    assert batch.output_pos[:4].tolist() == [4, 2, 1, 1]


@PATHS
def test_min_tokens_ban_follows_the_output_position(use_triton: bool) -> None:
    """EOS is the argmax everywhere but banned while fewer than min_tokens outputs precede the row."""
    logits = torch.zeros(4, VOCAB, device=DEVICE)
    logits[:, EOS] = 10.0
    logits[torch.arange(4), torch.tensor([5, 6, 7, 8])] = 5.0
    greedy, top_1 = SamplingParams(temperature=0.0, min_tokens=2), SamplingParams(top_k=1, min_tokens=2, seed=1)
    drafts = [[5, 6, EOS], [5, 6, EOS], [5, EOS]]
    out = verify(Sampler(use_triton=use_triton), torch.cat([logits, logits, logits[:3]]), drafts, make_batch([greedy, top_1, greedy]))
    assert out.token_ids.tolist() == [5, 6, EOS, EOS] * 2 + [5, 6, -1]
    assert out.num_emitted.tolist() == [4, 4, 2]


@PATHS
def test_banned_drafts_are_rejected(use_triton: bool) -> None:
    """A single-token bad word, a bad word the drafts complete ("ad" = 1, 4), and a draft outside allowed_token_ids."""
    n = 200
    logits = torch.zeros(2, VOCAB, device=DEVICE)
    logits[:, 1] = logits[:, 4] = 8.0
    params = [SamplingParams(seed=i, bad_words=["ad"], top_k=[0, 2][i % 2]) if i % 3 else SamplingParams(temperature=0.0, bad_words=["ad"]) for i in range(n)]
    out = verify(Sampler(use_triton=use_triton), logits.repeat(n, 1), [[1]] * n, make_batch(params))
    emitted = out.token_ids.view(n, 2)
    accepted = emitted[:, 0] == 1
    assert accepted.sum() > n // 4 and (emitted[accepted, 1] != 4).all() and (emitted[~accepted, 1] == -1).all()
    params = [SamplingParams(seed=i, bad_words=["q"], allowed_token_ids=[1, 3, 5]) for i in range(n)]  # "q" = 1
    out = verify(Sampler(use_triton=use_triton), logits.repeat(n, 1), [[1], [4]] * (n // 2), make_batch(params))
    assert (out.num_emitted == 1).all() and set(out.token_ids.view(n, 2)[:, 0].tolist()) == {3, 5}


@PATHS
def test_draft_outside_the_truncated_set_is_always_rejected(use_triton: bool) -> None:
    n = 400
    logits = torch.linspace(3.0, -3.0, VOCAB, device=DEVICE).repeat(2 * n, 1)
    params = [SamplingParams(top_k=2, seed=i if i % 2 else None) for i in range(n)]
    out = verify(Sampler(use_triton=use_triton), logits, [[5]] * n, make_batch(params))
    assert (out.num_emitted == 1).all()
    assert set(out.token_ids.view(n, 2)[:, 0].tolist()) == {0, 1}


@PATHS
def test_draft_with_probability_one_is_always_accepted(use_triton: bool) -> None:
    n = 100
    logits = random_logits(4 * n, seed=3)
    top = logits.argmax(dim=-1).view(n, 4)
    drafts = [top[i, :3].tolist() for i in range(n)]
    params = [SamplingParams(top_k=1, seed=i) if i % 2 else SamplingParams(allowed_token_ids=[int(top[i, 0])]) for i in range(n)]
    out = verify(Sampler(use_triton=use_triton), logits, drafts, make_batch(params))
    allowed_rows = torch.arange(n) % 2 == 0
    assert (out.num_emitted[~allowed_rows] == 4).all()
    assert torch.equal(out.token_ids.view(n, 4)[~allowed_rows].cpu(), top[~allowed_rows].cpu())
    # The allowlist row: its first draft has p = 1; later drafts are outside the allowlist unless equal to it.
    assert (out.token_ids.view(n, 4)[allowed_rows, 0] == top[allowed_rows, 0]).all()


def test_batched_record_equals_repeated_single_records() -> None:
    params = [SamplingParams(frequency_penalty=0.1, dry_multiplier=0.5)] * 5
    rows = [3, 0, 4, 1]
    emitted = [[7], [1, 2, 3], [4, 4], [9, 8, 7, 6]]
    row_counts = [3, 3, 2, 5]
    ids = [t for tokens, count in zip(emitted, row_counts) for t in tokens + [-1] * (count - len(tokens))]
    cu = torch.tensor([0, *torch.tensor(row_counts).cumsum(0).tolist()], device=DEVICE)
    batched, single = make_batch(params), make_batch(params)
    batched.record(torch.tensor(rows, device=DEVICE), torch.tensor(ids, device=DEVICE), cu)
    for t in range(4):
        step = [(r, tokens[t]) for r, tokens in zip(rows, emitted) if t < len(tokens)]
        single.record(torch.tensor([r for r, _ in step], device=DEVICE), torch.tensor([x for _, x in step], device=DEVICE))
    assert_same_state(batched, single)
    assert batched.output_pos.tolist() == [3, 4, 0, 1, 2]


def test_a_loose_rows_bound_changes_nothing() -> None:
    """On an accelerator the longest request is bounded by num_rows - n + 1 (no sync); the stage inputs are the same."""
    draft_ids, cu = verify_layout(DRAFTS)
    assert max_rows_bound(cu, len(draft_ids)) == 5
    assert max_rows_bound(cu.to("meta"), len(draft_ids)) == len(draft_ids) - len(DRAFTS) + 1
    batch = make_batch(MIXED)
    plain = RowView.of(batch, torch.arange(len(MIXED), device=DEVICE))
    exact = plain.with_drafts(draft_ids.to(DEVICE), cu.to(DEVICE), 5)
    loose = plain.with_drafts(draft_ids.to(DEVICE), cu.to(DEVICE), len(draft_ids))
    tokens = torch.arange(VOCAB, device=DEVICE).expand(len(draft_ids), -1)
    assert torch.equal(exact.output_counts_at(tokens), loose.output_counts_at(tokens))
    table = batch.entries.tables()[0]
    assert torch.equal(exact.rows_of_slots(table.slot), loose.rows_of_slots(table.slot)[:, :5])
    assert (loose.rows_of_slots(table.slot)[:, 5:] == -1).all()


def test_record_never_writes_past_the_history() -> None:
    """Tokens past max_model_len are counted but not written; padding rows change nothing."""
    batch = SamplingBatch(2, VOCAB, 6, DEVICE)
    for row in range(2):
        batch.add_request(row, SamplingParams(dry_multiplier=0.5), PROMPT, TokenizedStrings())
    batch.record(torch.tensor([0, 1], device=DEVICE), torch.tensor([7, 8, 9, 10, 11, -1, -1], device=DEVICE), torch.tensor([0, 4, 7]))
    assert batch.history.tolist() == [[*PROMPT, 7, 8], [*PROMPT, 11, -1]]
    assert batch.history_len.tolist() == [6, 5] and batch.output_pos.tolist() == [4, 1]
