"""Graceful drain under load (issue 29, item 4): replicas of the ingress and of the detokenizer pool
scaled down while closed-loop streams run, and every stream checked.

``python -m bench.drain [--quick] [--scale-downs N] [--streams N] [--out PATH] [--min-draining-period-s S]`` starts one local Ray
cluster as ``make run`` serves (`bench.lib.serve_cluster.DEFAULT_PROXY`: HAProxy on Serve's port in
front of the ingress replicas, with Serve's 30 s draining window for them, as ``make run`` keeps it),
deploys ``tiny-random`` (one engine thread) with every step detokenized on the pool
(``inline_detok_threshold`` 0, in calls of 64 tokens so both pool replicas serve each step) and two
replicas of each deployment. N clients (one ``httpx.AsyncClient``, one connection, each) stream
greedy completions with ``ignore_eos`` through HAProxy's port, each sending the next as soon as one
ends, over a few distinct prompts whose references (text) are streamed before any scale-down.

It then forces the scale-downs, alternating between ``Ingress`` and ``Detokenizer``: each deploys the
app again with the same arguments and one replica for that deployment (Serve's declarative API, as
``serve deploy`` does; same arguments, other replica counts: a lightweight update, in which Serve
stops one replica through its graceful shutdown, the path the autoscaler's scale-down takes), waits
until one replica runs and no other is left, then deploys two again and lets the new replica take
streams. Each stream is judged by `bench.lib.drain_report` (cut: no ``[DONE]``, an error, fewer
tokens than asked; wrong: other text than its prompt's reference). Rows per deployment and for all
streams: scale-downs counted (two running to one, a replica seen stopping, none started),
streams completed, cut and wrong, and the longest drain; written with the machine, the load
averages and the wall time to bench/results/drain.json, with each scale-down, the replica
timelines and the cut or wrong streams.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

import httpx
from ray import serve

from bench.lib.common import print_table, quietness, write_results
from bench.lib.drain_report import ScaleDown, StreamRecord, cut_reason, drain_rows, failed_streams
from bench.lib.load_client import stream_one_httpx
from bench.lib.serve_cluster import DEFAULT_PROXY, ReplicaWatcher, ServeCluster
from deployments.driver import wait_until_healthy

APP = "spout"
DEPLOYMENTS = ("Ingress", "Detokenizer")
ARGS = {
    "model": "tiny-random",
    "engine_cpu_threads": "1",
    "max_num_seqs": "256",
    "max_model_len": "256",
    "inline_detok_threshold": "0",
    "detok_tokens_per_call": "64",
    "detok_min_replicas": "1",
    "detok_max_replicas": "2",
    "ingress_min_replicas": "2",
    "ingress_max_replicas": "2",
}
"""The app's arguments, the same in every deploy: a change of arguments would rebuild the app and replace every replica."""
MIN_DRAINING_PERIOD_S = 30.0
"""Serve's default, which ``make run`` keeps: a stopping ingress replica stays reachable this long so that HAProxy stops sending to
it first, then closes its listener (HAProxy retries a refused connection elsewhere) and waits for the requests still in flight."""
PROMPTS = 8
MAX_TOKENS = 48
WARMUP_S = 5.0
SETTLE_S = 5.0
"""After a scale-up, how long the new replica takes streams before the next scale-down."""
POLL_S = 0.2
DRAIN_WAIT_S = 180.0
"""Longer than Serve's force-kill deadline for a stopping replica (``replica_drain_timeout_s`` 60 s, the draining window included)."""
START_WAIT_S = 300.0
STREAM_TIMEOUT_S = 120.0


def overrides(counts: dict[str, int]) -> list[dict[str, object]]:
    """Fixed replica counts per deployment (the pool's autoscaling off, so that only the benchmark scales it)."""
    return [{"name": name, "num_replicas": count} | ({"autoscaling_config": None} if name == "Detokenizer" else {}) for name, count in counts.items()]


def body(prompt: int) -> dict[str, object]:
    return {
        "model": ARGS["model"],
        "prompt": f"Stream {prompt}: say something long.",
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


class Load:
    """``streams`` closed-loop clients; ``records`` every request they made, ``live`` how many are in flight."""

    def __init__(self, port: int, streams: int, started: float) -> None:
        self.port, self.streams, self.started = port, streams, started
        self.records: list[StreamRecord] = []
        self.live = 0
        self.stopping = asyncio.Event()

    def now(self) -> float:
        return time.monotonic() - self.started

    async def client(self, index: int) -> None:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.port}", timeout=STREAM_TIMEOUT_S, limits=limits) as client:
            sent = 0
            while not self.stopping.is_set():
                prompt = (index + sent) % PROMPTS
                began, self.live = self.now(), self.live + 1
                result = await stream_one_httpx(client, body(prompt))
                self.live -= 1
                self.records.append(StreamRecord(prompt, began, self.now(), result))
                sent += 1


async def references(port: int) -> list[str]:
    """Each prompt's greedy text, streamed one at a time before the load starts."""
    texts = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=STREAM_TIMEOUT_S) as client:
        for prompt in range(PROMPTS):
            result = await stream_one_httpx(client, body(prompt))
            if reason := cut_reason(result, MAX_TOKENS):
                raise RuntimeError(f"the reference stream of prompt {prompt} failed: {reason}")
            texts.append(result.text)
    return texts


async def wait_for_states(watcher: ReplicaWatcher, running: int, timeout_s: float, load: Load) -> tuple[float | None, bool, bool, int]:
    """Poll until ``running`` replicas run and no other is left: (seconds it took or None, a replica
    seen stopping, one seen starting, streams live when one was first seen stopping)."""
    started = time.monotonic()
    stopping_seen = starting_seen = False
    live = 0
    while time.monotonic() - started < timeout_s:
        states = await asyncio.to_thread(watcher.states)
        if states.get("STOPPING") and not stopping_seen:
            stopping_seen, live = True, load.live
        starting_seen = starting_seen or bool(states.get("STARTING"))
        if states == {"RUNNING": running}:
            return round(time.monotonic() - started, 2), stopping_seen, starting_seen, live
        await asyncio.sleep(POLL_S)
    return None, stopping_seen, starting_seen, live


async def scale_down_and_up(cluster: ServeCluster, watchers: dict[str, ReplicaWatcher], deployment: str, number: int, load: Load) -> ScaleDown:
    watcher = watchers[deployment]
    before = await asyncio.to_thread(watcher.states)
    counts = dict.fromkeys(DEPLOYMENTS, 2) | {deployment: 1}
    for w in watchers.values():
        w.phase = f"{number}: {deployment} down"
    requested = load.now()
    await asyncio.to_thread(cluster.deploy_config, APP, ARGS, overrides(counts))
    drain_s, stopping_seen, starting_seen, live = await wait_for_states(watcher, 1, DRAIN_WAIT_S, load)
    for w in watchers.values():
        w.phase = f"{number}: {deployment} up"
    await asyncio.to_thread(cluster.deploy_config, APP, ARGS, overrides(dict.fromkeys(DEPLOYMENTS, 2)))
    if (await wait_for_states(watcher, 2, START_WAIT_S, load))[0] is None:
        raise RuntimeError(f"{deployment} did not come back to two replicas: {watcher.timeline}")
    await asyncio.sleep(SETTLE_S)
    scale_down = ScaleDown(deployment, round(requested, 2), before, stopping_seen, starting_seen, drain_s, live)
    print(f"scale-down {number}: {deployment} {'counted' if scale_down.counted else 'NOT counted'}, drain {drain_s} s, {live} streams live", flush=True)
    return scale_down


async def measure(cluster: ServeCluster, port: int, streams: int, scale_downs: int) -> dict[str, object]:
    reference_texts = await references(port)
    load = Load(port, streams, time.monotonic())
    clients = [asyncio.create_task(load.client(i)) for i in range(streams)]
    watchers = {name: ReplicaWatcher(APP, name, period_s=0.5) for name in DEPLOYMENTS}
    forced: list[ScaleDown] = []
    with ExitStack() as watching:
        for watcher in watchers.values():
            watching.enter_context(watcher)
        try:
            await asyncio.sleep(WARMUP_S)
            for number in range(scale_downs):
                forced.append(await scale_down_and_up(cluster, watchers, DEPLOYMENTS[number % len(DEPLOYMENTS)], number, load))
        finally:
            load.stopping.set()
            await asyncio.wait_for(asyncio.gather(*clients), STREAM_TIMEOUT_S * 2)
    return {
        "rows": drain_rows(forced, load.records, reference_texts, MAX_TOKENS),
        "scale_down_log": [asdict(s) | {"counted": s.counted} for s in forced],
        "failed_streams": failed_streams(load.records, reference_texts, MAX_TOKENS),
        "timelines": {name: w.timeline for name, w in watchers.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 scale-downs (one of each) under 32 streams")
    parser.add_argument("--scale-downs", type=int, default=None, help="scale-downs to force (default 20; --quick: 2)")
    parser.add_argument("--streams", type=int, default=None, help="closed-loop streams (default 256; --quick: 32)")
    parser.add_argument("--out", type=Path, default=None, help="JSON to write (default bench/results/drain.json)")
    parser.add_argument(
        "--min-draining-period-s",
        type=float,
        default=MIN_DRAINING_PERIOD_S,
        help="RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S (default 30, make run's; 0: the listener closes at once, as the tests have it)",
    )
    args = parser.parse_args()
    scale_downs = args.scale_downs or (2 if args.quick else 20)
    streams = args.streams or (32 if args.quick else 256)
    load_before = os.getloadavg()
    started = time.monotonic()
    with ServeCluster(DEFAULT_PROXY, env={"RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": str(args.min_draining_period_s)}) as cluster:
        port = cluster.deploy_config(APP, ARGS, overrides(dict.fromkeys(DEPLOYMENTS, 2)))
        wait_until_healthy(f"http://127.0.0.1:{port}", START_WAIT_S)
        serve_states = {name: ReplicaWatcher(APP, name).wait_for(2, START_WAIT_S) for name in DEPLOYMENTS}
        if None in serve_states.values():
            raise RuntimeError(f"the deployments did not reach two replicas each: {serve.status()}")
        result = asyncio.run(measure(cluster, port, streams, scale_downs))
    print_table(result["rows"])
    summary = {
        "quick": args.quick,
        "streams": streams,
        "max_tokens": MAX_TOKENS,
        "prompts": PROMPTS,
        "app_args": ARGS,
        "min_draining_period_s": args.min_draining_period_s,
        "wall_s": round(time.monotonic() - started),
        **quietness(load_before[0]),
        "load_averages_before": [round(x, 2) for x in load_before],
        "load_averages_after": [round(x, 2) for x in os.getloadavg()],
    }
    print(f"wrote {write_results('drain', result.pop('rows'), args.out, **summary, **result)}")


if __name__ == "__main__":
    main()
