"""`bench.lib.prefix_workloads`: the routing benchmark's prompts have the shapes its docstring promises."""

from __future__ import annotations

import random
from collections import Counter

from bench.lib.prefix_workloads import PromptShape, PromptSource, WorkloadName, chat_header

SHAPE = PromptShape(prefix_tokens=128, suffix_tokens=8, num_prefixes=10)
HEADER = chat_header("tiny-random")


def prompts(workload: WorkloadName, count: int = 400) -> list[list[int]]:
    source = PromptSource(workload, SHAPE, HEADER, seed=0)
    rng = random.Random(1)
    return [source.next(rng) for _ in range(count)]


def test_every_prompt_starts_with_the_chat_header_and_has_the_same_length():
    assert len(HEADER) == 24  # the default model's template with its default system prompt
    for workload in WorkloadName:
        assert all(p[: len(HEADER)] == HEADER and len(p) == 136 for p in prompts(workload))


def test_many_prefixes_uses_each_prefix_and_no_sharing_none():
    shared = Counter(tuple(p[:128]) for p in prompts(WorkloadName.MANY_PREFIXES))
    assert len(shared) == 10 and min(shared.values()) > 20
    assert len({tuple(p[:128]) for p in prompts(WorkloadName.NO_SHARING)}) == 400


def test_uneven_has_one_hot_prefix_and_a_tail():
    shared = Counter(tuple(p[:128]) for p in prompts(WorkloadName.UNEVEN)).most_common()
    assert 0.6 < shared[0][1] / 400 < 0.8 and len(shared) == 1 + 5


def test_both_policies_see_the_same_prompts():
    assert prompts(WorkloadName.UNEVEN) == prompts(WorkloadName.UNEVEN)
