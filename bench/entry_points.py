"""Egress CPU per token of each way a user starts the app, against ``make run``'s (issue 29's goal:
every entry point within 1.5x of ``make run``).

``python -m bench.entry_points [--quick] [--out PATH]`` starts each entry point as a user does, in a
process group of its own, on loopback, serving `bench.egress_peers`' tiny HF folder (its engine on
one thread), one after the other:

- ``make_run``: ``python -m deployments.launch --port P model=<folder> ...``, what ``make run`` runs;
- ``serve_run_import_path``: ``serve run deployments:build_app model=<folder> ...`` (port 8000, which
  Ray fixes for an import path);
- ``serve_run_config``: ``serve_config.yaml`` with the same options and a free port, run by ``serve run``
  with the environment its header documents (`deployments.fast_path.FAST_PATH_ENV`). ``serve deploy``
  and ``ray up cluster.yaml`` start the same processes with the same switches (the cluster files'
  ``ray start`` lines; ``tests/deployments/test_entry_points.py`` checks that HAProxy serves there).

Each gets the load of `bench.egress_peers` (the httpx client, 64 and 256 concurrent streaming
completions of 64 tokens, greedy, ``ignore_eos``, until a level has streamed 16,384 tokens), and the
CPU of its processes is read from /proc per kind (`bench.lib.process_cpu`: descendants of this
process, the client excluded). Rows are raw CPU, idle included, as `bench.egress_peers` reports
them; ``differs_from_make_run`` counts streams whose text is not ``make run``'s for the same prompt.
Then Ctrl-C to the group (each one's log: /tmp/bench-entry-points-<name>.log). Prints a table and
writes bench/results/entry_points.json (``--quick``: entry_points_quick.json).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from bench.egress_peers import ENGINE_THREADS, MAX_TOKENS, MIN_TOKENS, QUICK_MIN_TOKENS, SERVED_NAME, SPOUT, Level, level_row, model_folder, run_level
from bench.lib.common import RESULTS_DIR, print_table, quietness, write_results
from bench.lib.serve_cluster import free_port
from bench.serve_load import HOST, warm_up
from deployments.fast_path import FAST_PATH_ENV
from deployments.processes import port_is_free

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
LEVELS = (64, 256)
START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 120.0
SERVE_RUN_PORT = 8000
GOAL_RATIO = 1.5
LOG_DIR = Path("/tmp")


@dataclass(frozen=True)
class EntryPoint:
    name: str
    command: list[str]
    environment: dict[str, str]
    port: int


def app_options(folder: Path) -> dict[str, str]:
    return {"model": str(folder), "served_model_name": SERVED_NAME, "engine_cpu_threads": str(ENGINE_THREADS)}


def base_environment(ray_dir: str) -> dict[str, str]:
    """This process's environment without the fast path's switches (each entry point sets its own, or
    documents them), HAProxy's side ports free, Ray's files in ``ray_dir``, and a stopping replica's
    port closed at once (Serve keeps it open 30 s for HAProxy, which only makes each Ctrl-C longer)."""
    env = os.environ | {"RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()), "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port()), "RAY_TMPDIR": ray_dir}
    return {name: value for name, value in env.items() if name not in FAST_PATH_ENV} | {"RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0"}


def config_copy(folder: Path, options: dict[str, object], port: int) -> Path:
    """serve_config.yaml with ``options`` and ``port``."""
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    config["http_options"]["port"] = port
    config["applications"][0]["args"].update(options)
    path = folder / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def entry_points(folder: Path, scratch: Path, ray_dir: str) -> list[EntryPoint]:
    options = app_options(folder)
    words = [f"{key}={value}" for key, value in options.items()]
    env = base_environment(ray_dir)
    port, config_port = free_port(), free_port()
    return [
        EntryPoint("make_run", [sys.executable, "-m", "deployments.launch", "--port", str(port), *words], env, port),
        EntryPoint("serve_run_import_path", [str(BIN / "serve"), "run", "deployments:build_app", *words], env, SERVE_RUN_PORT),
        EntryPoint("serve_run_config", [str(BIN / "serve"), "run", str(config_copy(scratch, options, config_port))], env | FAST_PATH_ENV, config_port),
    ]


def answers_a_completion(port: int, model: str) -> bool:
    """Whether a two-token completion of ``model`` on loopback ``port`` comes back with 200."""
    body = {"model": model, "prompt": "hello", "max_tokens": 2}
    try:
        return httpx.post(f"http://{HOST}:{port}/v1/completions", json=body, timeout=60).status_code == 200
    except httpx.HTTPError:
        return False


def wait_answering(entry: EntryPoint, serving: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if serving.poll() is not None:
            raise RuntimeError(f"{entry.name} exited with {serving.returncode}; see {log}")
        if answers_a_completion(entry.port, SERVED_NAME):
            return
        time.sleep(1)
    raise RuntimeError(f"{entry.name} did not answer on port {entry.port} within {START_TIMEOUT_S:.0f} s; see {log}")


def sweep(entry: EntryPoint, levels: tuple[int, ...], min_tokens: int, log: Path) -> list[Level]:
    """Start ``entry`` in a process group of its own, run each level, then Ctrl-C the group."""
    if not port_is_free(HOST, entry.port):
        raise RuntimeError(f"{entry.name} serves on port {entry.port}, which is taken")
    with log.open("wb") as out:
        serving = subprocess.Popen(entry.command, cwd=ROOT, env=entry.environment, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_answering(entry, serving, log)
        warm_up(entry.port, SERVED_NAME)
        return [run_level(entry.port, concurrency, min_tokens) for concurrency in levels]
    finally:
        os.killpg(serving.pid, signal.SIGINT)
        try:
            serving.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(serving.pid, signal.SIGKILL)
            serving.wait()


def entry_row(name: str, level: Level, references: list[str | None]) -> dict[str, object]:
    """`bench.egress_peers.level_row` of Spout's front, named for the entry point and compared with ``make run``'s texts."""
    row = level_row(SPOUT, level, references)
    row["server"] = name
    row["differs_from_make_run"] = row.pop("differs_from_vllm")
    return row


def ratios_to_make_run(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """Per entry point and level: its front's CPU per token over ``make run``'s, against `GOAL_RATIO`."""
    base = {r["concurrency"]: r for r in rows if r["server"] == "make_run"}
    out = []
    for row in rows:
        reference = base.get(row["concurrency"])
        if row["server"] != "make_run" and reference is not None:
            ratio = row["cpu_us_per_token_front"] / max(reference["cpu_us_per_token_front"], 1e-9)
            out.append(
                {
                    "entry_point": row["server"],
                    "concurrency": row["concurrency"],
                    "front_cpu_over_make_run": round(ratio, 2),
                    "within_goal": ratio <= GOAL_RATIO,
                }
            )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="64 streams only, 1,024 tokens")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    levels, min_tokens = ((64,), QUICK_MIN_TOKENS) if args.quick else (LEVELS, MIN_TOKENS)
    folder = model_folder()
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    rows: list[dict[str, object]] = []
    scratch, ray_dir = Path(tempfile.mkdtemp(prefix="spout-entry-points-")), tempfile.mkdtemp(prefix="spout-ray-", dir="/tmp")
    try:
        references: dict[int, list[str | None]] = {}
        for entry in entry_points(folder, scratch, ray_dir):
            for level in sweep(entry, levels, min_tokens, LOG_DIR / f"bench-entry-points-{entry.name}.log"):
                concurrency, results = level[0], level[1]
                references.setdefault(concurrency, [r.text for r in results[:concurrency]])
                rows.append(entry_row(entry.name, level, references[concurrency]))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(ray_dir, ignore_errors=True)
    ratios = ratios_to_make_run(rows)
    summary = {"quick": args.quick, "max_tokens": MAX_TOKENS, "min_tokens_per_level": min_tokens, "engine_threads": ENGINE_THREADS, "ratios": ratios}
    summary |= quietness(load_before) | {"load_average_after": round(os.getloadavg()[0], 2), "wall_s": round(time.monotonic() - started)}
    path = write_results("entry_points", rows, args.out or (RESULTS_DIR / "entry_points_quick.json" if args.quick else None), **summary)
    print_table(rows)
    print_table(ratios)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
