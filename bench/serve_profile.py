"""Where the egress CPU goes: py-spy profiles of each process under steady streaming load.

``python -m bench.serve_profile [--proxy P] [--mode M] [--streams N] [--max-tokens T] [--seconds S] [--egress-peers]``
deploys one `bench.serve_load` mode, keeps N streams running back to back (each finished
round starts the next), samples every process of the cluster with py-spy (installed
with Ray) for S seconds, and writes bench/results/serve_profile.txt: per process, its
CPU µs per output token over the window, the functions with the largest share of
its non-idle samples (inclusive), and the lines that spent them (self time), so the
closing figures have a breakdown. ``--egress-peers`` profiles `bench.egress_peers`'s Spout
side instead: ``make run``'s app (the defaults, its engine on one thread as there) on the egress-tiny folder behind
``--front`` (``serve``: HAProxy; ``replica``: the replicas' own server), read by the httpx client, written to
bench/results/serve_profile_egress_peers.txt (``serve_profile_egress_peers_replica_front.txt``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from ray.serve import Application

from bench import egress_peers
from bench.lib.common import RESULTS_DIR, machine_info
from bench.lib.load_client import completion_body, run_streams
from bench.lib.process_cpu import cpu_seconds
from bench.lib.serve_cluster import FRONTS, ServeCluster, front_options
from bench.serve_load import HOST, MAIN_PROXY, TIMEOUT_S, Run, build, warm_up

PY_SPY = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
PROFILED_KINDS = ("ingress", "detok", "engine", "proxy", "controller")
IDLE_LEAVES = ("Worker.main_loop", "Thread.run (threading.py")
"""Innermost frames of a waiting thread: Ray's main loop, an event loop in its C poll."""
WRAPPERS = ("Thread._bootstrap", "Thread.run (threading.py", "<module> (", "_inject_tracing_into_class", "context_decorator")
"""Frames under every sample of a thread; not shown."""


class LoadLoop:
    """``streams`` at a time, back to back, in a thread, counting output tokens. After each round it
    marks (tokens so far, the time, `cpu_seconds`), so that CPU per token can be read over whole rounds."""

    def __init__(self, port: int, model: str, streams: int, max_tokens: int, client: str = "raw") -> None:
        self.bodies = [completion_body(model, i, max_tokens, True) for i in range(streams)]
        self.port = port
        self.client = client
        self.tokens = 0
        self.marks: list[tuple[int, float, dict[str, tuple[str, float]]]] = [(0, time.monotonic(), cpu_seconds())]
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopping.is_set():
            results, _ = asyncio.run(run_streams(HOST, self.port, self.bodies, TIMEOUT_S, self.client))
            self.tokens += sum(r.tokens for r in results)
            self.marks.append((self.tokens, time.monotonic(), cpu_seconds()))


def summarize(raw: Path, top: int) -> list[str]:
    """The ``top`` functions by share of non-idle samples, inclusive, then the ``top`` innermost
    frames (self time), from py-spy's raw output."""
    inclusive: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not stack or frames[-1].startswith(IDLE_LEAVES):
            continue
        total += int(count)
        leaves[frames[-1]] += int(count)
        for frame in set(frames):
            inclusive[frame] += int(count)
    shown = [(f, n) for f, n in inclusive.most_common() if not f.startswith(WRAPPERS)][:top]
    lines = [f"  {total} non-idle samples (py-spy sees Python threads only; Ray's own threads are the rest of the CPU)"]
    lines += [f"  {100 * n / max(total, 1):5.1f}%  {frame[:130]}" for frame, n in shown]
    return lines + ["  self time:"] + [f"  {100 * n / max(total, 1):5.1f}%  {frame[:130]}" for frame, n in leaves.most_common(top)]


def profile(run: Run, app: Callable[[int], Application], streams: int, seconds: int, top: int) -> list[str]:
    """``app(cluster port)`` deployed as ``run.mode`` under ``run.proxy``, loaded with ``run.client``, sampled."""
    lines = [f"{run.mode} under {run.proxy}, {run.client} client, {streams} streams of {run.max_tokens} tokens back to back, {seconds} s, py-spy at 100 Hz"]
    with ServeCluster(run.proxy) as cluster, tempfile.TemporaryDirectory() as folder:
        port = cluster.deploy(app(cluster.port), run.mode)
        warm_up(port, run.model)
        load = LoadLoop(port, run.model, streams, run.max_tokens, run.client)
        load.thread.start()
        time.sleep(3)
        targets = {pid: kind for pid, (kind, _) in cpu_seconds().items() if kind in PROFILED_KINDS}
        first_mark = len(load.marks)
        spies = {
            pid: subprocess.Popen(
                [PY_SPY, "record", "--pid", pid, "--duration", str(seconds), "--rate", "100", "--format", "raw", "--nonblocking", "-o", f"{folder}/{pid}.txt"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for pid in targets
        }
        for spy in spies.values():
            spy.wait(timeout=seconds + 60)
        # CPU per token over the rounds that ended while py-spy sampled (the round under way at the start if none did).
        marks = load.marks[first_mark - 1 :]
        while len(marks) < 2 and load.thread.is_alive():
            time.sleep(0.5)
            marks = load.marks[first_mark - 1 :]
        (tokens_before, started, before), (tokens_after, ended, after) = marks[0], marks[-1]
        tokens = tokens_after - tokens_before
        load.stopping.set()
        load.thread.join(timeout=TIMEOUT_S)
        rate = tokens / max(ended - started, 1e-9)
        lines.append(f"output tokens in {len(marks) - 1} whole rounds around the window: {tokens} ({rate:.0f} tokens/s)")
        for pid, kind in sorted(targets.items(), key=lambda item: item[1]):
            start = before.get(pid, (kind, 0.0))[1]
            cpu_us = (after.get(pid, (kind, start))[1] - start) / max(tokens, 1) * 1e6
            lines.append(f"\n{kind} (pid {pid}): {cpu_us:.1f} CPU µs per output token")
            raw = Path(f"{folder}/{pid}.txt")
            lines += summarize(raw, top) if raw.exists() else ["  (no samples)"]
        cluster.delete(run.mode)
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--proxy", default=MAIN_PROXY)
    parser.add_argument("--mode", default="inline")
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--egress-peers", action="store_true", help="bench.egress_peers's Spout side: make run's app on the egress-tiny folder, httpx client")
    parser.add_argument("--front", choices=sorted(FRONTS), default="replica", help="with --egress-peers: the app's http_front (make run's is replica)")
    args = parser.parse_args(argv)
    if args.egress_peers:
        run = Run(egress_peers.SERVED_NAME, FRONTS[args.front], "defaults", (args.streams,), args.max_tokens, "serve_port", "httpx")
        folder = egress_peers.model_folder()

        def app(port: int) -> Application:
            return egress_peers.spout_app(folder, front_options(args.front, port))

        path = RESULTS_DIR / ("serve_profile_egress_peers" + ("_replica_front" if args.front == "replica" else "") + ".txt")
    else:
        run = Run(args.model, args.proxy, args.mode, (args.streams,), args.max_tokens)
        built, path = build(run), RESULTS_DIR / "serve_profile.txt"

        def app(port: int) -> Application:
            return built

    lines = [f"machine: {machine_info()}", f"load average before: {os.getloadavg()[0]:.2f}", *profile(run, app, args.streams, args.seconds, args.top)]
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
