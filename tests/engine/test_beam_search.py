"""Beam search in the engine equals a plain beam search over brute-force logprobs, and frees all it holds.

The reference computes each prefix's next-token logprobs by a whole forward pass of the prompt and
the prefix (no KV cache shared with anything), over a vocabulary cut to a few tokens by
``allowed_token_ids``; a search wide enough to prune nothing is checked against the best of every
continuation, enumerated.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from engine.beam.choices import beam_choice_outputs
from engine.config import EngineConfig
from engine.core import EngineCore, InvalidRequestError
from engine.kv.kv_cache import PagedKVCache, bytes_per_block
from engine.loader.checkpoint import Checkpoint
from engine.models.attention_metadata import ScheduledChunk, build_attention_metadata
from engine.outputs import EngineOutput, FinishReason
from sampling.params import SamplingParams
from tests.engine.conftest import run_until_done

EOS = 2
ALLOWED = [EOS, 4937, 11201]
PROMPT = [1, 9690, 198, 3835, 314, 253]  # 6 tokens: blocks of 4 leave the last one half full, so forks copy it
BLOCK_SIZE = 4


def tiny_engine(checkpoint: Checkpoint, **overrides) -> EngineCore:
    config = {"model": "tiny-random", "max_num_seqs": 12, "max_model_len": 64, "block_size": BLOCK_SIZE, "dtype": "float32"} | overrides
    return EngineCore(EngineConfig(**config), checkpoint)


class Oracle:
    """Next-token logprobs over ``ALLOWED`` after prompt + prefix, one whole forward pass per prefix (memoized)."""

    def __init__(self, engine: EngineCore) -> None:
        self.model, self.device = engine.runner.model, engine.runner.device
        self.cache = PagedKVCache(engine.model_config, 8, BLOCK_SIZE, torch.float32, self.device)
        self.memo: dict[tuple[int, ...], dict[int, float]] = {}

    def __call__(self, prefix: tuple[int, ...]) -> dict[int, float]:
        if prefix not in self.memo:
            tokens = PROMPT + list(prefix)
            chunk = ScheduledChunk(tuple(range(-(-len(tokens) // BLOCK_SIZE))), 0, len(tokens))
            meta = build_attention_metadata([chunk], BLOCK_SIZE, self.device)
            with torch.inference_mode():
                hidden = self.model(torch.tensor(tokens, device=self.device), meta, self.cache.keys, self.cache.values)
                logits = self.model.compute_logits(hidden[-1:])[0].float()
            allowed = torch.log_softmax(logits[ALLOWED], dim=-1).tolist()
            self.memo[prefix] = dict(zip(ALLOWED, allowed))
        return self.memo[prefix]


def reference_score(tokens: tuple[int, ...], logprob: float, length_penalty: float) -> float:
    length = len(PROMPT) + len(tokens) - (tokens[-1:] == (EOS,))
    return logprob / length**length_penalty


def reference_beam_search(
    oracle: Oracle, width: int, max_tokens: int, length_penalty: float, early_stopping: bool | str
) -> list[tuple[tuple[int, ...], float]]:
    """vLLM's beam search written out plainly: (tokens, cumulative logprob) of the best ``width``, best first."""
    live: list[tuple[tuple[int, ...], float]] = [((), 0.0)]
    done: list[tuple[tuple[int, ...], float]] = []
    by_score = lambda beam: reference_score(*beam, length_penalty)  # noqa: E731
    while True:
        expanded = [(tokens + (t,), logprob + lp) for tokens, logprob in live for t, lp in sorted(oracle(tokens).items(), key=lambda kv: -kv[1])]
        expanded = sorted(expanded, key=lambda beam: -beam[1])[: 2 * width]
        ended = [beam for beam in expanded if beam[0][-1] == EOS or len(beam[0]) == max_tokens]
        going = [beam for beam in expanded if beam not in ended]
        done = sorted(done + ended, key=by_score, reverse=True)[:width]
        if not going:
            return done
        if len(done) >= width:
            worst = by_score(done[-1])
            if early_stopping is True:
                return done
            if early_stopping == "never" and length_penalty > 0:
                best_possible = going[0][1] / (len(PROMPT) + max_tokens) ** length_penalty
            else:
                best_possible = by_score(going[0])
            if worst >= best_possible:
                return done
        live = going[:width]


def beam_params(width: int, max_tokens: int, length_penalty: float, early_stopping: bool | str, **extra) -> SamplingParams:
    return SamplingParams(
        n=width,
        use_beam_search=True,
        max_tokens=max_tokens,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
        allowed_token_ids=ALLOWED,
        **extra,
    )


def final_beams(outputs: list[EngineOutput]) -> list[tuple[tuple[int, ...], float]]:
    (output,) = outputs
    assert output.beams is not None and output.finish_reason == FinishReason.STOP
    return [(beam.token_ids, beam.cumulative_logprob) for beam in output.beams]


def assert_same_beams(got: list[tuple[tuple[int, ...], float]], want: list[tuple[tuple[int, ...], float]]) -> None:
    assert [tokens for tokens, _ in got] == [tokens for tokens, _ in want]
    assert [logprob for _, logprob in got] == pytest.approx([logprob for _, logprob in want], abs=1e-4)


def assert_all_free(engine: EngineCore) -> None:
    pool = engine.scheduler.blocks.pool
    assert pool.num_held == 0 and pool.num_available == pool.num_blocks
    assert sorted(engine.scheduler.free_slots) == list(range(engine.config.max_num_seqs))
    assert not engine.scheduler.running and not engine.scheduler.waiting and not engine.beams.groups


CASES = [(width, length_penalty, early_stopping) for width in (1, 2, 3) for length_penalty in (0.0, 1.0, 2.5) for early_stopping in (False, True, "never")]


@pytest.mark.parametrize(
    ("overrides", "pool_blocks"),
    [({}, None), ({"enable_prefix_caching": False}, None), ({"async_scheduling": True}, None), ({}, 10)],
    ids=["prefix-cache", "no-prefix-cache", "async", "preempting"],
)
def test_beam_search_equals_the_plain_reference(tiny_checkpoint, overrides, pool_blocks):
    """Every case at once in one engine: searches fork, copy, free (and, in a pool of 10 blocks, far
    fewer than they need side by side, are preempted) side by side."""
    if pool_blocks is not None:
        overrides = {"kv_cache_memory": bytes_per_block(tiny_checkpoint.config, BLOCK_SIZE, torch.float32) * pool_blocks}
    engine = tiny_engine(tiny_checkpoint, **overrides)
    oracle = Oracle(engine)
    max_tokens = 4
    for index, case in enumerate(CASES):
        engine.add_request(f"case-{index}", PROMPT, beam_params(*case[:1], max_tokens, *case[1:]))
    outputs = run_until_done(engine)
    for index, (width, length_penalty, early_stopping) in enumerate(CASES):
        want = reference_beam_search(oracle, width, max_tokens, length_penalty, early_stopping)
        assert_same_beams(final_beams(outputs[f"case-{index}"]), want)
    assert_all_free(engine)
    assert (engine.num_preemptions > 0) == (pool_blocks is not None)


def test_a_search_that_prunes_nothing_returns_the_best_of_every_continuation(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint)
    oracle = Oracle(engine)
    max_tokens, width, length_penalty = 3, 8, 1.0
    every = []
    for tokens in itertools.chain.from_iterable(itertools.product(ALLOWED, repeat=k) for k in range(1, max_tokens + 1)):
        if EOS in tokens[:-1] or (len(tokens) < max_tokens and tokens[-1] != EOS):
            continue  # not a whole continuation: it ended earlier, or goes on
        logprob = sum(oracle(tokens[:i])[t] for i, t in enumerate(tokens))
        every.append((tokens, logprob))
    best = sorted(every, key=lambda beam: reference_score(*beam, length_penalty), reverse=True)[:width]
    engine.add_request("wide", PROMPT, beam_params(width, max_tokens, length_penalty, "never"))
    assert_same_beams(final_beams(run_until_done(engine)["wide"]), best)


def test_logprobs_and_choice_outputs_of_the_beams(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint)
    engine.add_request("r", PROMPT, beam_params(2, 3, 1.0, False, logprobs=2, ignore_eos=True))
    (output,) = run_until_done(engine)["r"]
    choices = beam_choice_outputs(output)
    assert [c.request_id for c in choices] == ["r/beam0", "r/beam1"]
    for choice, beam in zip(choices, output.beams or []):
        assert choice.finish_reason == FinishReason.LENGTH and len(choice.new_token_ids) == 3
        assert choice.logprobs is not None and len(choice.logprobs) == 3
        assert sum(entry.logprob for entry in choice.logprobs) == pytest.approx(beam.cumulative_logprob)
        assert all(len(entry.top_token_ids) == 2 and entry.rank >= 1 for entry in choice.logprobs)


def test_fewer_continuations_than_beams_fill_the_rest_with_empty_beams(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint)
    engine.add_request("r", PROMPT, SamplingParams(n=3, use_beam_search=True, max_tokens=1, allowed_token_ids=ALLOWED[:2]))
    (output,) = run_until_done(engine)["r"]
    assert output.beams is not None and [len(beam.token_ids) for beam in output.beams] == [1, 1, 0]
    assert output.beams[2].cumulative_logprob == -float("inf") and output.beams[2].finish_reason == FinishReason.STOP
    assert_all_free(engine)


def test_aborting_a_search_midway_frees_every_row_and_block(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint, max_num_seqs=6)
    engine.add_request("beams", PROMPT, SamplingParams(n=4, use_beam_search=True, max_tokens=40, ignore_eos=True))
    engine.add_request("other", PROMPT, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    for _ in range(6):
        engine.step()
    assert len(engine.beams.groups["beams"].sequences) == 4 and len(engine.scheduler.free_slots) == 1
    assert engine.scheduler.blocks.pool.num_held > 0
    engine.abort_requests(["beams", "other"])
    (beams,) = [o for o in engine.step() if o.request_id == "beams"]
    assert beams.finish_reason == FinishReason.ABORT and beams.beams is not None and len(beams.beams) == 4
    assert_all_free(engine)
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"top_p": 0.5}, "top_p"),
        ({"presence_penalty": 1.0}, "presence_penalty"),
        ({"min_tokens": 2}, "min_tokens"),
        ({"num_speculative_tokens": 2}, "num_speculative_tokens"),
        ({"logit_bias": {5: 1.0}}, "logit_bias"),
        ({"n": 13}, "n"),
    ],
)
def test_fields_beam_search_cannot_honour_are_refused_naming_them(tiny_checkpoint, fields, param):
    engine = tiny_engine(tiny_checkpoint)
    with pytest.raises(InvalidRequestError, match=f"^{param}: "):
        engine.add_request("r", PROMPT, SamplingParams(**{"n": 2, "use_beam_search": True} | fields))
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize(("fields", "param"), [({"length_penalty": 2.0}, "length_penalty"), ({"early_stopping": True}, "early_stopping")])
def test_beam_fields_without_beam_search_are_refused(tiny_checkpoint, fields, param):
    with pytest.raises(InvalidRequestError, match=f"^{param}: "):
        tiny_engine(tiny_checkpoint).add_request("r", PROMPT, SamplingParams(**fields))
