"""A step's long poll as a Ray actor call against the same poll on the engine channel.

``python -m bench.engine_channel [--polls N]`` starts Ray on loopback with two actors: an engine
stand-in whose poll answers at once with one step of ``STREAMS`` plain outputs (a `Polled`, as
`EngineActor.get_outputs` gives it), and a caller (an ingress replica's output loop) that polls it
``N`` times, first as Ray calls (``get_outputs.remote``, as the router did), then over the
`deployments.engine_channel` connection, then as Ray calls again (the machine's speed drifts). Each
row: the wall time of a poll and the CPU of each side per poll, read from /proc. The reference is
the Ray call. Rows go to bench/results/engine_channel.json.
"""

from __future__ import annotations

import argparse
import os
import time

import ray

from bench.lib.common import print_table, quietness, write_results
from bench.lib.process_cpu import TICKS_PER_S
from deployments.engine_actor import Polled
from deployments.engine_channel import ChannelAddress, ChannelServer, EngineChannel, EngineMethod
from engine.outputs import EngineOutput

STREAMS = 64
POLLS = 2000
WARM_UP_POLLS = 200


def process_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def one_step() -> Polled:
    return Polled(1, [EngineOutput(f"cmpl-{i}", [1000 + i], 12) for i in range(STREAMS)])


class Engine:
    """The engine stand-in: the poll of `EngineActor.get_outputs`, as a Ray method and on a channel."""

    def __init__(self) -> None:
        self.channel = ChannelServer({EngineMethod.GET_OUTPUTS: self.get_outputs}, "127.0.0.1")

    def pid(self) -> int:
        return os.getpid()

    async def get_outputs(self, subscriber: str, timeout_s: float, aborts: list[str]) -> Polled:
        return one_step()

    async def channel_address(self) -> ChannelAddress:
        return await self.channel.address()


class Caller:
    """An ingress replica's output loop: ``polls`` polls one after the other."""

    def pid(self) -> int:
        return os.getpid()

    async def poll_ray(self, engine: ray.actor.ActorHandle, polls: int) -> None:
        for _ in range(polls):
            await engine.get_outputs.remote("bench", 1.0, [])

    async def poll_channel(self, engine: ray.actor.ActorHandle, polls: int) -> None:
        channel = EngineChannel(engine, "bench")  # type: ignore[arg-type]
        for _ in range(polls):
            await channel.poll(1.0, [])
        channel.close()


def measure(transport: str, engine: ray.actor.ActorHandle, caller: ray.actor.ActorHandle, pids: tuple[int, int], polls: int) -> dict[str, object]:
    method = caller.poll_ray if transport == "ray_call" else caller.poll_channel
    ray.get(method.remote(engine, WARM_UP_POLLS))
    engine_before, caller_before = (process_cpu_s(pid) for pid in pids)
    started = time.perf_counter()
    ray.get(method.remote(engine, polls))
    wall_s = time.perf_counter() - started
    engine_after, caller_after = (process_cpu_s(pid) for pid in pids)
    return {
        "transport": transport,
        "outputs_per_poll": STREAMS,
        "polls": polls,
        "wall_us_per_poll": round(wall_s / polls * 1e6, 1),
        "caller_cpu_us_per_poll": round((caller_after - caller_before) / polls * 1e6, 1),
        "engine_cpu_us_per_poll": round((engine_after - engine_before) / polls * 1e6, 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--polls", type=int, default=POLLS)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        engine = ray.remote(Engine).remote()
        caller = ray.remote(Caller).remote()
        pids = (ray.get(engine.pid.remote()), ray.get(caller.pid.remote()))
        rows = [measure(transport, engine, caller, pids, args.polls) for transport in ("ray_call", "channel", "ray_call")]
    finally:
        ray.shutdown()
    print_table(rows)
    print(f"wrote {write_results('engine_channel', rows, **quietness(load_before))}")


if __name__ == "__main__":
    main()
