"""The engine under ``scheduling_policy`` ``priority``: queue order by priority and by client turns,
preemption of lower priorities when the KV pool runs short, and greedy outputs unchanged by it;
``fcfs`` refuses priorities (vLLM's behaviour). In-process, tiny random model."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig
from engine.core import EngineCore, InvalidRequestError
from engine.fair_share import SchedulingPolicy
from engine.generate import generate
from engine.loader.random_shapes import TINY_RANDOM
from sampling.params import SamplingParams

BLOCK_BYTES = 8192
"""One KV block of `tiny-random` (16 positions, float32)."""


def engine(checkpoint, policy: SchedulingPolicy = SchedulingPolicy.PRIORITY, max_num_seqs: int = 1, blocks: int = 64) -> EngineCore:
    config = EngineConfig(
        model=TINY_RANDOM, max_num_seqs=max_num_seqs, max_model_len=128, kv_cache_memory=blocks * BLOCK_BYTES, scheduling_policy=policy, dtype="float32"
    )
    return EngineCore(config, checkpoint)


def params(priority: int = 0, max_tokens: int = 4) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, priority=priority)


def first_token_order(core: EngineCore, max_steps: int = 2000) -> list[str]:
    """Step until done; the request ids in the order their first token came."""
    order: list[str] = []
    for _ in range(max_steps):
        if not core.has_unfinished_requests():
            return order
        for output in core.step():
            if output.new_token_ids and output.request_id not in order:
                order.append(output.request_id)
    raise AssertionError("requests still unfinished")


def test_fcfs_refuses_a_priority(tiny_checkpoint):
    core = engine(tiny_checkpoint, SchedulingPolicy.FCFS)
    with pytest.raises(InvalidRequestError, match="priority"):
        core.add_request("r", [1, 2, 3], params(priority=1))
    core.add_request("r", [1, 2, 3], params(priority=0))  # 0 is the default and passes


def test_the_queue_runs_lower_priority_values_first(tiny_checkpoint):
    core = engine(tiny_checkpoint)
    for i, priority in enumerate([3, 3, 1, -2, 1]):
        core.add_request(f"p{priority}-{i}", [1, 2, 3, 4], params(priority))
    assert first_token_order(core) == ["p-2-3", "p1-2", "p1-4", "p3-0", "p3-1"]


def test_a_burst_of_one_client_does_not_starve_another(tiny_checkpoint):
    core = engine(tiny_checkpoint)
    for i in range(8):
        core.add_request(f"burst-{i}", [1, 2, 3, 4], params(), client="10.0.0.1")
    core.add_request("other", [5, 6, 7], params(), client="10.0.0.2")
    core.add_request("header", [5, 6, 7], params(), client="10.0.0.1", client_id="team-b")  # same address, its own client id
    order = first_token_order(core)
    assert order.index("other") <= 1 and order.index("header") <= 2, order


def test_fcfs_keeps_arrival_order(tiny_checkpoint):
    core = engine(tiny_checkpoint, SchedulingPolicy.FCFS)
    for i in range(4):
        core.add_request(f"burst-{i}", [1, 2, 3, 4], params(), client="a")
    core.add_request("other", [5, 6, 7], params(), client="b")
    assert first_token_order(core) == ["burst-0", "burst-1", "burst-2", "burst-3", "other"]


def test_a_short_pool_preempts_lower_priority_and_outputs_stay_exact(tiny_checkpoint):
    """Two low-priority requests hold most of an 8-block pool; a high-priority one that needs 4
    blocks preempts one of them, streams before either finishes, and every output equals the greedy
    tokens of the request alone (the preempted one recomputes)."""
    prompts = {"low-0": list(range(1, 31)), "low-1": list(range(40, 70)), "high": list(range(100, 160))}
    alone_engine = engine(tiny_checkpoint, max_num_seqs=1, blocks=8)
    alone = {name: generate(alone_engine, prompt, params(max_tokens=40)) for name, prompt in prompts.items()}
    core = engine(tiny_checkpoint, max_num_seqs=3, blocks=8)
    outputs: dict[str, list[int]] = {name: [] for name in prompts}
    finished: list[str] = []
    core.add_request("low-0", prompts["low-0"], params(priority=5, max_tokens=40))
    core.add_request("low-1", prompts["low-1"], params(priority=5, max_tokens=40))
    for step in range(2000):
        if step == 6:
            core.add_request("high", prompts["high"], params(priority=0, max_tokens=40))
        if step > 6 and not core.has_unfinished_requests():
            break
        for output in core.step():
            outputs[output.request_id].extend(output.new_token_ids)
            if output.finish_reason is not None:
                finished.append(output.request_id)
    assert core.num_preemptions > 0
    assert finished[0] == "high", finished
    assert outputs == alone
