"""`deployments.engine_routing`, in-process: prompts that share their key meet on one engine in every
replica and every process, the load bound holds, engines that are down are skipped, an engine going
down moves only its own keys, and prompts without a key (or the least-loaded policy) go least-loaded."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deployments.engine_routing import EngineRouting, Pick, Placement, RoutingPolicy, rendezvous_ranking

ROOT = Path(__file__).resolve().parents[2]
ROUTING = EngineRouting(RoutingPolicy.PREFIX, prefix_tokens=64, load_slack=4, load_slack_fraction=0.25)
token_ids = st.integers(min_value=0, max_value=2**32 - 1)
loads = st.lists(st.integers(min_value=0, max_value=500), min_size=1, max_size=16)


def keyed_prompt(seed: int, length: int = 200) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(49152) for _ in range(length)]


@given(st.lists(token_ids, min_size=64, max_size=64), st.lists(token_ids, min_size=1, max_size=50), st.lists(token_ids, min_size=1, max_size=50))
def test_prompts_that_share_the_key_go_to_one_engine_in_independent_routers(prefix, suffix_a, suffix_b):
    live, up = [3, 3, 3, 3, 3], [0, 1, 2, 3, 4]
    first = EngineRouting(RoutingPolicy.PREFIX, 64, 4, 0.25).pick(prefix + suffix_a, live, up).engine
    second = EngineRouting(RoutingPolicy.PREFIX, 64, 4, 0.25).pick(prefix + suffix_b, list(live), list(up)).engine
    assert first == second


def test_the_choice_is_the_same_in_another_process_whatever_its_hash_seed():
    """No per-process salt (Python's ``hash`` would have one): replicas in other processes agree."""
    prompts = [keyed_prompt(seed) for seed in range(20)]
    here = [ROUTING.pick(p, [0] * 8, list(range(8))).engine for p in prompts]
    code = (
        "import random, sys\n"
        "from deployments.engine_routing import EngineRouting, RoutingPolicy\n"
        "from tests.deployments.test_engine_routing import ROUTING, keyed_prompt\n"
        "print([ROUTING.pick(keyed_prompt(s), [0] * 8, list(range(8))).engine for s in range(20)])\n"
    )
    env = os.environ | {"PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env, cwd=ROOT).stdout
    assert there.strip() == str(here)
    assert len(set(here)) > 1  # and the keys do spread


@given(st.lists(token_ids, min_size=65, max_size=300), loads, st.data())
def test_the_chosen_engine_is_up_and_within_the_load_slack_of_the_least_loaded(prompt, live, data):
    up = data.draw(st.lists(st.sampled_from(range(len(live))), min_size=1, unique=True))
    engine = ROUTING.pick(prompt, live, up).engine
    least = min(live[i] for i in up)
    assert engine in up
    assert live[engine] <= least + max(ROUTING.load_slack, ROUTING.load_slack_fraction * least)


def test_an_engine_beyond_the_slack_loses_its_keys_to_their_next_engine():
    prompt = keyed_prompt(1)
    ranking = rendezvous_ranking(ROUTING.prefix_key(prompt), [0, 1, 2, 3])
    first, second = ranking[0], ranking[1]
    live = [10, 10, 10, 10]
    live[first] = 10 + 4  # at the slack: still chosen
    assert ROUTING.pick(prompt, live, [0, 1, 2, 3]) == Pick(first, Placement.AFFINITY)
    live[first] = 10 + 5  # past it: the key's second engine, not the least-loaded one
    assert ROUTING.pick(prompt, live, [0, 1, 2, 3]) == Pick(second, Placement.SPILLED)
    live = [100, 100, 100, 100]
    live[first] = 125  # at high load the proportional slack (25%) applies
    assert ROUTING.pick(prompt, live, [0, 1, 2, 3]).engine == first
    live[first] = 126
    assert ROUTING.pick(prompt, live, [0, 1, 2, 3]).engine == second


def test_an_engine_going_down_moves_only_the_keys_it_had():
    prompts = [keyed_prompt(seed) for seed in range(2000)]
    engines = list(range(6))
    before = [ROUTING.pick(p, [0] * 6, engines).engine for p in prompts]
    for down in engines:
        up = [e for e in engines if e != down]
        after = [ROUTING.pick(p, [0] * 6, up).engine for p in prompts]
        moved = [i for i in range(len(prompts)) if before[i] != after[i]]
        assert moved == [i for i in range(len(prompts)) if before[i] == down]
        assert len(set(after[i] for i in moved)) == 5  # its keys spread over all the others


def test_keys_spread_evenly_over_the_engines():
    counts = Counter(ROUTING.pick(keyed_prompt(seed), [0] * 4, [0, 1, 2, 3]).engine for seed in range(4000))
    assert sorted(counts) == [0, 1, 2, 3]
    assert all(800 <= count <= 1200 for count in counts.values())


@pytest.mark.parametrize("length", [0, 1, 15, 16, 63, 64])
def test_a_prompt_no_longer_than_the_key_goes_to_the_least_loaded_engine(length):
    prompt = keyed_prompt(3, length)
    assert ROUTING.prefix_key(prompt) is None
    assert ROUTING.pick(prompt, [5, 2, 7, 2], [0, 1, 2, 3]) == Pick(1, Placement.LEAST_LOADED)
    assert ROUTING.pick(prompt, [5, 2, 7, 2], [0, 2, 3]).engine == 3


@given(st.lists(token_ids, max_size=300), loads, st.data())
def test_the_least_loaded_policy_ignores_the_prompt(prompt, live, data):
    up = data.draw(st.lists(st.sampled_from(range(len(live))), min_size=1, unique=True))
    engine = EngineRouting(RoutingPolicy.LEAST_LOADED).pick(prompt, live, up).engine
    assert engine in up and live[engine] == min(live[i] for i in up)


def test_chat_prompts_that_share_only_the_template_header_have_different_keys():
    header = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182, 2, 198, 1, 4093, 198]
    keys = {ROUTING.prefix_key(header + keyed_prompt(seed, 100)) for seed in range(50)}
    assert len(keys) == 50
    shared_system_prompt = header + keyed_prompt(99, 100)
    assert len({ROUTING.prefix_key(shared_system_prompt + keyed_prompt(seed, 30)) for seed in range(50)}) == 1


def test_no_engine_up_is_an_error():
    with pytest.raises(ValueError):
        ROUTING.pick(keyed_prompt(1), [0, 0], [])
