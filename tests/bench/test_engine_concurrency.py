"""`bench.engine_concurrency`'s prompt sets: a warm-up set of the same shape that shares no prompt with the measured one."""

from __future__ import annotations

from bench.engine_concurrency import PROMPT_TOKENS, SYSTEM_PROMPT_TOKENS, distinct_prompts, shared_system_prompts


def test_the_warm_up_prompts_are_shaped_as_the_measured_ones_and_none_of_them():
    for count in (16, 64, 256):
        measured, warm_up = distinct_prompts(count), distinct_prompts(count, count)
        assert len(warm_up) == count and {len(p) for p in warm_up} == {PROMPT_TOKENS}
        assert len({tuple(p) for p in measured + warm_up}) == 2 * count  # no prompt twice: none is cached for another


def test_the_shared_warm_up_caches_the_system_prompt_and_no_question():
    measured, warm_up = shared_system_prompts(64), shared_system_prompts(64, 64)
    assert {tuple(p[:SYSTEM_PROMPT_TOKENS]) for p in measured + warm_up} == {tuple(measured[0][:SYSTEM_PROMPT_TOKENS])}
    assert not {tuple(p) for p in measured} & {tuple(p) for p in warm_up}
