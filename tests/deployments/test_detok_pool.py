"""The detok pool's client split and its fan-out autoscaling signal, in-process."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st
from ray.serve.config import AutoscalingContext

from deployments.detok_pool import FANOUT_METRIC, DetokClient, Detokenizer, fanout_autoscaling_policy, split_by_tokens
from detok import DetokItem, initial_state
from detok.batch import detokenize_batch
from engine.config import DEFAULT_MODEL
from engine.loader.model_files import load_tokenizer
from sampling.params import SamplingParams

TOKENIZER = load_tokenizer(DEFAULT_MODEL).tokenizer
STATE = initial_state(TOKENIZER, TOKENIZER.encode("Hello").ids, SamplingParams())


def items(sizes: list[int]) -> list[DetokItem]:
    return [DetokItem(STATE, list(range(100, 100 + size))) for size in sizes]


@given(st.lists(st.integers(0, 40), max_size=60), st.integers(1, 64))
def test_split_keeps_order_and_bounds_each_part(sizes: list[int], budget: int):
    batch = items(sizes)
    parts = split_by_tokens(batch, budget)
    assert [item for part in parts for item in part] == batch
    assert all(part for part in parts) or batch == []
    for part in parts:
        tokens = sum(len(item.new_token_ids) for item in part)
        assert tokens <= budget or len(part) == 1


def test_a_step_of_512_single_tokens_goes_out_in_two_calls_of_256():
    parts = split_by_tokens(items([1] * 512), 256)
    assert [len(part) for part in parts] == [256, 256]


def context(widest: dict[str, float] | None) -> AutoscalingContext:
    metrics = None if widest is None else {FANOUT_METRIC: widest}
    return AutoscalingContext(
        deployment_id=None,
        deployment_name="Detokenizer",
        app_name="spout",
        current_num_replicas=1,
        target_num_replicas=1,
        running_replicas=[],
        total_num_requests=0.0,
        total_queued_requests=0.0,
        aggregated_metrics=metrics,
        raw_metrics=None,
        capacity_adjusted_min_replicas=1,
        capacity_adjusted_max_replicas=4,
        policy_state={},
        last_scale_up_time=None,
        last_scale_down_time=None,
        current_time=None,
        config=None,
    )


def test_policy_wants_one_replica_per_call_of_the_widest_step():
    assert fanout_autoscaling_policy(context({"a": 2.0, "b": 3.0}))[0] == 3.0
    assert fanout_autoscaling_policy(context({}))[0] == 0.0
    assert fanout_autoscaling_policy(context(None))[0] == 0.0


def test_replica_reports_the_widest_fanout_since_its_last_report():
    replica = Detokenizer(DEFAULT_MODEL)
    assert replica.record_autoscaling_stats() == {FANOUT_METRIC: 0}
    replica.detokenize(items([1]), fanout=3)
    replica.detokenize(items([1]), fanout=2)
    assert replica.record_autoscaling_stats() == {FANOUT_METRIC: 3}
    assert replica.record_autoscaling_stats() == {FANOUT_METRIC: 0}


class CountingPool:
    """A pool handle whose calls run in-process and are counted."""

    def __init__(self) -> None:
        self.calls = 0
        self.detokenize = self

    def remote(self, part: list[DetokItem], fanout: int):
        self.calls += 1

        async def answer():
            return detokenize_batch(TOKENIZER, part)

        return answer()


def test_a_prompts_logprob_strings_go_to_the_pool_not_the_ingress_loop():
    pool = CountingPool()
    client = DetokClient(TOKENIZER, pool, inline_threshold=8, tokens_per_call=256)
    asyncio.run(client.detokenize([DetokItem(STATE, [], True, list(range(100, 200)))]))  # no new token, 100 strings
    assert (pool.calls, client.inline_batches) == (1, 0)
    asyncio.run(client.detokenize([DetokItem(STATE, [101], False, [101, 102])]))
    assert (pool.calls, client.inline_batches) == (1, 1)
