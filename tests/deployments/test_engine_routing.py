"""`deployments.engine_routing`, in-process: prompts that share their key meet on one engine in every
replica and every process, a new key goes to the least-loaded engine, the load bound holds, engines
that are down are skipped, an engine going down moves only its own keys, and prompts without a key
(or the least-loaded policy) go least-loaded."""

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

from deployments.engine_routing import EngineRouting, KeyHomes, Pick, Placement, RoutingPolicy, rendezvous_ranking

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
    first = EngineRouting(RoutingPolicy.PREFIX, 64, 4, 0.25).pick(prefix + suffix_a, live, up, KeyHomes()).engine
    second = EngineRouting(RoutingPolicy.PREFIX, 64, 4, 0.25).pick(prefix + suffix_b, list(live), list(up), KeyHomes()).engine
    assert first == second


def test_the_choice_is_the_same_in_another_process_whatever_its_hash_seed():
    """No per-process salt (Python's ``hash`` would have one): replicas in other processes agree."""
    prompts = [keyed_prompt(seed) for seed in range(20)]
    here = [ROUTING.pick(p, [0] * 8, list(range(8)), KeyHomes()).engine for p in prompts]
    code = (
        "import random, sys\n"
        "from deployments.engine_routing import KeyHomes\n"
        "from tests.deployments.test_engine_routing import ROUTING, keyed_prompt\n"
        "print([ROUTING.pick(keyed_prompt(s), [0] * 8, list(range(8)), KeyHomes()).engine for s in range(20)])\n"
    )
    env = os.environ | {"PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env, cwd=ROOT).stdout
    assert there.strip() == str(here)
    assert len(set(here)) > 1  # and the keys do spread


@given(st.lists(token_ids, min_size=65, max_size=300), loads, st.data(), st.booleans())
def test_the_chosen_engine_is_up_and_within_the_load_slack_of_the_least_loaded(prompt, live, data, seen):
    up = data.draw(st.lists(st.sampled_from(range(len(live))), min_size=1, unique=True))
    homes = KeyHomes()
    if seen:  # the key's home is any engine, up or down
        homes.set(ROUTING.prefix_key(prompt), data.draw(st.sampled_from(range(len(live)))))
    engine = ROUTING.pick(prompt, live, up, homes).engine
    least = min(live[i] for i in up)
    assert engine in up
    assert live[engine] <= least + max(ROUTING.load_slack, ROUTING.load_slack_fraction * least)


@given(st.lists(token_ids, min_size=65, max_size=300), loads, st.data())
def test_a_new_key_goes_to_the_least_loaded_engine_and_makes_it_its_home(prompt, live, data):
    up = data.draw(st.lists(st.sampled_from(range(len(live))), min_size=1, unique=True))
    homes = KeyHomes()
    pick = ROUTING.pick(prompt, live, up, homes)
    assert pick.placement is Placement.NEW_KEY and live[pick.engine] == min(live[i] for i in up)
    assert homes.get(ROUTING.prefix_key(prompt)) == pick.engine
    assert ROUTING.pick(prompt, live, up, homes) == Pick(pick.engine, Placement.AFFINITY)


def test_a_home_beyond_the_slack_spills_to_the_next_engine_of_the_ranking_and_comes_back():
    prompt = keyed_prompt(1)
    ranking = rendezvous_ranking(ROUTING.prefix_key(prompt), [0, 1, 2, 3])
    first, second = ranking[0], ranking[1]
    homes = KeyHomes()
    assert ROUTING.pick(prompt, [10, 10, 10, 10], [0, 1, 2, 3], homes) == Pick(first, Placement.NEW_KEY)
    live = [10, 10, 10, 10]
    live[first] = 10 + 4  # at the slack: still chosen
    assert ROUTING.pick(prompt, live, [0, 1, 2, 3], homes) == Pick(first, Placement.AFFINITY)
    live[first] = 10 + 5  # past it: the key's second engine, not the least-loaded one
    assert ROUTING.pick(prompt, live, [0, 1, 2, 3], homes) == Pick(second, Placement.SPILLED)
    live = [100, 100, 100, 100]
    live[first] = 125  # at high load the proportional slack (25%) applies
    assert ROUTING.pick(prompt, live, [0, 1, 2, 3], homes) == Pick(first, Placement.AFFINITY)
    live[first] = 126
    assert ROUTING.pick(prompt, live, [0, 1, 2, 3], homes) == Pick(second, Placement.SPILLED)
    assert ROUTING.pick(prompt, [3, 3, 3, 3], [0, 1, 2, 3], homes) == Pick(first, Placement.AFFINITY)  # the load evened out


def test_a_new_key_under_uneven_load_makes_its_home_where_the_load_is_least():
    """Keyed placement alone sent a new key to its ranking's first engine within the slack: prompts that
    share nothing were spread at random, where least-loaded evens the load out."""
    prompt = keyed_prompt(2)
    first = rendezvous_ranking(ROUTING.prefix_key(prompt), [0, 1, 2, 3])[0]
    live = [12, 12, 12, 12]
    live[first] = 14  # within the slack, but not the least loaded
    homes = KeyHomes()
    pick = ROUTING.pick(prompt, live, [0, 1, 2, 3], homes)
    assert pick.placement is Placement.NEW_KEY and pick.engine != first and live[pick.engine] == 12
    assert ROUTING.pick(prompt, [12, 12, 12, 12], [0, 1, 2, 3], homes) == Pick(pick.engine, Placement.AFFINITY)


def test_a_key_whose_home_is_down_is_new_again():
    prompt = keyed_prompt(4)
    homes = KeyHomes()
    home = ROUTING.pick(prompt, [0, 0, 0], [0, 1, 2], homes).engine
    up = [e for e in (0, 1, 2) if e != home]
    pick = ROUTING.pick(prompt, [0, 5, 5] if home == 0 else [5, 0, 5] if home == 1 else [5, 5, 0], up, homes)
    assert pick.placement is Placement.NEW_KEY and pick.engine in up and homes.get(ROUTING.prefix_key(prompt)) == pick.engine


def test_the_memory_of_homes_is_bounded_and_forgets_the_least_recent_key():
    homes = KeyHomes(capacity=3)
    for key in (b"a", b"b", b"c"):
        homes.set(key, 0)
    assert homes.get(b"a") == 0  # now the most recent
    homes.set(b"d", 1)
    assert len(homes.homes) == 3 and homes.get(b"b") is None and homes.get(b"a") == 0


def test_an_engine_going_down_moves_only_the_keys_it_had():
    prompts = [keyed_prompt(seed) for seed in range(2000)]
    engines = list(range(6))
    before = [ROUTING.pick(p, [0] * 6, engines, KeyHomes()).engine for p in prompts]
    for down in engines:
        up = [e for e in engines if e != down]
        after = [ROUTING.pick(p, [0] * 6, up, KeyHomes()).engine for p in prompts]  # as a replica that never saw them
        homes = KeyHomes()
        assert [ROUTING.pick(p, [0] * 6, engines, homes).engine for p in prompts] == before
        assert [ROUTING.pick(p, [0] * 6, up, homes).engine for p in prompts] == after  # as the one that saw them all up
        moved = [i for i in range(len(prompts)) if before[i] != after[i]]
        assert moved == [i for i in range(len(prompts)) if before[i] == down]
        assert len(set(after[i] for i in moved)) == 5  # its keys spread over all the others


def test_keys_spread_evenly_over_the_engines():
    counts = Counter(ROUTING.pick(keyed_prompt(seed), [0] * 4, [0, 1, 2, 3], KeyHomes()).engine for seed in range(4000))
    assert sorted(counts) == [0, 1, 2, 3]
    assert all(800 <= count <= 1200 for count in counts.values())


@pytest.mark.parametrize("length", [0, 1, 15, 16, 63, 64])
def test_a_prompt_no_longer_than_the_key_goes_to_the_least_loaded_engine(length):
    prompt = keyed_prompt(3, length)
    assert ROUTING.prefix_key(prompt) is None
    assert ROUTING.pick(prompt, [5, 2, 7, 2], [0, 1, 2, 3], KeyHomes()) == Pick(1, Placement.LEAST_LOADED)
    assert ROUTING.pick(prompt, [5, 2, 7, 2], [0, 2, 3], KeyHomes()).engine == 3


@given(st.lists(token_ids, max_size=300), loads, st.data())
def test_the_least_loaded_policy_ignores_the_prompt(prompt, live, data):
    up = data.draw(st.lists(st.sampled_from(range(len(live))), min_size=1, unique=True))
    engine = EngineRouting(RoutingPolicy.LEAST_LOADED).pick(prompt, live, up, KeyHomes()).engine
    assert engine in up and live[engine] == min(live[i] for i in up)


def test_chat_prompts_that_share_only_the_template_header_have_different_keys():
    header = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182, 2, 198, 1, 4093, 198]
    keys = {ROUTING.prefix_key(header + keyed_prompt(seed, 100)) for seed in range(50)}
    assert len(keys) == 50
    shared_system_prompt = header + keyed_prompt(99, 100)
    assert len({ROUTING.prefix_key(shared_system_prompt + keyed_prompt(seed, 30)) for seed in range(50)}) == 1


def test_no_engine_up_is_an_error():
    with pytest.raises(ValueError):
        ROUTING.pick(keyed_prompt(1), [0, 0], [], KeyHomes())
