"""The paged KV cache: tokens as before paging, preemption, prefix caching, no leaked blocks (tiny random model)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.core import EngineCore, InvalidRequestError
from engine.kv.block_pool import hash_block
from engine.kv.kv_cache import bytes_per_block
from engine.loader.checkpoint import Checkpoint
from engine.outputs import FinishReason
from sampling.params import SamplingParams
from sampling.tokenized import tokenize_strings
from tests.engine.conftest import output_ids, run_until_done
from tests.engine.mixed_workload import run_mixed

# `mixed_requests` run by `run_mixed` with the contiguous per-slot cache (commit c3e5eb7, before paging, with 64-bit seeds).
PRE_PAGING_TOKENS = {
    "short": [31107, 41349, 21989, 39476, 3691, 15612, 40378, 40885, 19679, 2652, 35641, 3394, 9526, 15696, 13518, 26213, 23553, 12604, 11173, 47402],
    "shared-a": [47535, 39155, 46496, 31685, 45628, 10425, 3134, 11769, 39640, 44141, 20940, 13768, 44889, 5959, 44884, 27058, 41780, 26753, 44554, 30869],
    "long": [45316, 46906, 32851, 6099, 46900, 47563, 42920, 8936, 7325, 44197, 14818, 31230, 5893, 46160, 30587, 24514, 39668, 39377, 5644, 36481],
    "shared-b": [29128, 7288, 14507, 29054, 1642, 17533, 20303, 657, 15514, 4016, 18641, 14007, 37472, 23684, 47986, 20093, 37090, 6838, 44909, 39961],
    "speculative": [1185, 1050, 935, 935, 935, 935, 935, 935, 935, 935, 935, 935, 935, 935, 935, 935, 935, 935, 935, 935],
    "guided": [45585, 30451, 38232, 13069, 22816, 40489, 2021, 6804, 34851, 40210, 26612, 31923, 26143, 33897, 30448, 9601, 2798, 18220, 43025, 22285],
    "seeded": [21703, 5659, 38232, 34707, 45914, 48752, 33084, 30685, 39718, 46546, 25150, 8343, 18564, 31065, 21248, 31930, 23910, 34467, 48705, 17346],
}
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
BLOCK_SIZE = 16


def pool_bytes(checkpoint: Checkpoint, num_blocks: int) -> int:
    return num_blocks * bytes_per_block(checkpoint.config, BLOCK_SIZE, checkpoint.weights["embed_tokens.weight"].dtype)


def tiny_engine(checkpoint: Checkpoint, **overrides) -> EngineCore:
    config = {"model": "tiny-random", "max_num_seqs": 4, "max_model_len": 128, "max_num_batched_tokens": 64, "dtype": "float32"} | overrides
    return EngineCore(EngineConfig(**config), checkpoint)


def count_computed_tokens(engine: EngineCore) -> list[int]:
    """A one-element list that counts the tokens the engine's steps compute from now on."""
    counted = [0]
    launch = engine.runner.launch

    def counting_launch(step, *args):
        counted[0] += len(step.input_ids)
        return launch(step, *args)

    engine.runner.launch = counting_launch  # type: ignore[method-assign]
    return counted


def assert_no_block_held(engine: EngineCore) -> None:
    pool = engine.scheduler.blocks.pool
    assert pool.num_held == 0 and pool.num_available == pool.num_blocks
    assert sorted(engine.scheduler.free_slots) == list(range(engine.config.max_num_seqs))


@pytest.mark.parametrize(
    "overrides",
    [{}, {"async_scheduling": True}, {"enable_prefix_caching": False}, {"max_num_batched_tokens": 512}],
    ids=["sync", "async", "no-prefix-cache", "unchunked"],
)
def test_mixed_workload_gives_the_tokens_of_the_contiguous_cache(tiny_checkpoint, overrides):
    engine, outputs = run_mixed(tiny_checkpoint, **overrides)
    assert outputs == PRE_PAGING_TOKENS
    assert engine.num_draft_tokens > engine.num_accepted_tokens > 0  # drafts were verified, some rejected
    assert engine.scheduler.num_preemptions == 0
    assert_no_block_held(engine)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_preemption_under_a_tiny_pool_gives_the_same_tokens(tiny_checkpoint, async_scheduling):
    # 6 blocks (96 positions) for 7 requests of up to 90 positions: the youngest are preempted and recomputed.
    engine, outputs = run_mixed(tiny_checkpoint, kv_cache_memory=pool_bytes(tiny_checkpoint, 6), async_scheduling=async_scheduling)
    assert engine.runner.kv_cache.num_blocks == 6
    assert engine.scheduler.num_preemptions > 0
    assert outputs == PRE_PAGING_TOKENS
    assert_no_block_held(engine)


def test_prefix_cache_hit_skips_the_prefill_and_gives_the_same_tokens(tiny_checkpoint):
    shared = list(range(500, 550))  # 3 full blocks and 2 tokens
    prompt = shared + [7, 8, 9]
    uncached = tiny_engine(tiny_checkpoint, enable_prefix_caching=False)
    uncached.add_request("b", prompt, GREEDY)
    expected = output_ids(run_until_done(uncached)["b"])

    engine = tiny_engine(tiny_checkpoint)
    engine.add_request("a", shared, GREEDY)
    run_until_done(engine)
    computed = count_computed_tokens(engine)
    engine.add_request("b", prompt, GREEDY)
    assert output_ids(run_until_done(engine)["b"]) == expected
    stats = engine.scheduler.blocks.stats
    assert stats.hit_tokens == 3 * BLOCK_SIZE
    assert stats.queried_tokens == len(shared) + len(prompt)
    assert computed[0] == len(prompt) - 3 * BLOCK_SIZE + GREEDY.max_tokens - 1
    assert_no_block_held(engine)


def test_a_whole_cached_prompt_still_computes_its_last_token(tiny_checkpoint):
    prompt = list(range(600, 600 + 3 * BLOCK_SIZE))  # exactly 3 blocks
    engine = tiny_engine(tiny_checkpoint)
    engine.add_request("a", prompt, GREEDY)
    first = output_ids(run_until_done(engine)["a"])
    computed = count_computed_tokens(engine)
    engine.add_request("b", prompt, GREEDY)
    assert output_ids(run_until_done(engine)["b"]) == first
    assert engine.scheduler.blocks.stats.hit_tokens == 2 * BLOCK_SIZE  # the last block holds the last prompt token
    assert computed[0] == BLOCK_SIZE + GREEDY.max_tokens - 1


def test_a_block_of_the_same_tokens_after_another_block_is_not_reused(tiny_checkpoint):
    # "a" caches block T after block P; "b" starts with T: its keys differ (positions, context), so no hit.
    block_p, block_t = list(range(800, 800 + BLOCK_SIZE)), list(range(900, 900 + BLOCK_SIZE))
    engine = tiny_engine(tiny_checkpoint)
    engine.add_request("a", block_p + block_t + [5], GREEDY)
    run_until_done(engine)
    engine.add_request("b", block_t + [5], GREEDY)
    run_until_done(engine)
    assert engine.scheduler.blocks.stats.hit_tokens == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2), min_size=8, max_size=8), st.lists(st.integers(0, 2), min_size=8, max_size=8))
def test_chain_hashes_are_equal_exactly_for_the_same_block_after_the_same_prefix(first, second):
    # Blocks of 2 tokens from a 3-token alphabet, so that equal blocks at different places are common.
    def chain(tokens: list[int]) -> list[bytes]:
        hashes: list[bytes] = []
        for start in range(0, len(tokens), 2):
            hashes.append(hash_block(hashes[-1] if hashes else None, tokens[start : start + 2]))
        return hashes

    for i, a in enumerate(chain(first)):
        for j, b in enumerate(chain(second)):
            assert (a == b) == (i == j and first[: 2 * i + 2] == second[: 2 * j + 2])


def test_cached_blocks_are_evicted_least_recently_used_first(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint, kv_cache_memory=pool_bytes(tiny_checkpoint, 4), max_model_len=64)
    first, second = list(range(100, 117)), list(range(200, 217))  # one full block each, plus a token
    for request_id, prompt in (("first", first), ("second", second), ("first-again", first)):
        engine.add_request(request_id, prompt, SamplingParams(temperature=0.0, max_tokens=1))
        run_until_done(engine)
    assert engine.scheduler.blocks.stats.hit_tokens == BLOCK_SIZE  # "first" was still cached
    # A request needing all 4 blocks evicts every cached block; the least recently used is gone first.
    engine.add_request("big", list(range(300, 360)), SamplingParams(temperature=0.0, max_tokens=1))
    run_until_done(engine)
    engine.add_request("second-again", second, SamplingParams(temperature=0.0, max_tokens=1))
    run_until_done(engine)
    assert engine.scheduler.blocks.stats.hit_tokens == BLOCK_SIZE
    assert_no_block_held(engine)


def test_aborts_mid_prefill_and_mid_decode_leak_no_block(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint, max_num_batched_tokens=8, kv_cache_memory=pool_bytes(tiny_checkpoint, 10))
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    for index in range(6):
        engine.add_request(str(index), list(range(1000 + 40 * index, 1040 + 40 * index)), params)
    for _ in range(12):
        engine.step()
    engine.abort_requests(["0", "3", "5"])
    outputs = run_until_done(engine)
    assert {request_id for request_id, out in outputs.items() if out[-1].finish_reason == FinishReason.ABORT} == {"0", "3", "5"}
    assert_no_block_held(engine)


def test_a_prompt_longer_than_the_pool_is_refused(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint, kv_cache_memory=pool_bytes(tiny_checkpoint, 4))
    assert engine.max_model_len == 4 * BLOCK_SIZE
    with pytest.raises(InvalidRequestError, match="the context holds 64"):
        engine.add_request("r", list(range(100, 170)), GREEDY)


def test_a_guided_request_too_large_for_the_pool_is_refused_or_ends_at_length(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint, kv_cache_memory=pool_bytes(tiny_checkpoint, 4))
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, guidance_scale=2.0, negative_prompt="a list of numbers")
    strings = tokenize_strings(params, engine.tokenizer.encode)
    with pytest.raises(InvalidRequestError, match="do not fit together"):
        engine.add_request("refused", list(range(100, 150)), params, strings)
    # Fits at first (2 + 1 blocks), but its sequence outgrows the 3 blocks the companion leaves it.
    engine.add_request("grows", list(range(100, 120)), params, strings)
    outputs = run_until_done(engine)["grows"]
    assert outputs[-1].finish_reason == FinishReason.LENGTH
    assert 0 < len(output_ids(outputs)) < params.max_tokens
    assert_no_block_held(engine)


def test_default_pool_holds_max_num_seqs_full_sequences_at_most(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint, max_num_seqs=3, max_model_len=100)
    assert engine.runner.kv_cache.num_blocks == 3 * 7


def test_a_pool_without_one_block_is_refused(tiny_checkpoint):
    with pytest.raises(ValueError, match="one block of 16 positions takes"):
        tiny_engine(tiny_checkpoint, kv_cache_memory=pool_bytes(tiny_checkpoint, 1) - 1)
