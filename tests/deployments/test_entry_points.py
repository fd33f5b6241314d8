"""Serve's fast path on every way a Ray Serve user starts the app (issue 29, item 1): HAProxy holds
the serving port, in front of replicas that serve HTTP themselves, as under ``make run ARGS="http_front=serve"``.

Three launches, `tiny-random` on loopback, each answered once:

- ``serve run deployments:build_app ...``: the app turns the fast path on before the CLI starts
  Ray (`deployments.fast_path`); Ctrl-C to its process group ends it with status 0, no "Aborted",
  and nothing of it left. Serve's port is fixed at 8000 for an import path: skipped when it is taken.
- ``ray start --head`` with the environment of ``cluster.yaml``'s head line (as ``ray up`` runs it),
  then ``serve deploy`` of ``serve_config.yaml`` (its model and port changed): the path of ``serve
  deploy``, ``ray up cluster.yaml`` and ``cluster-local.yaml``. Its processes are told apart by a
  mark in their environment and ended by it (``ray stop`` would end every cluster of the machine).

- ``serve run serve_config.yaml`` (its model and port changed) with the environment its header
  documents: Ray starts before the config is read, so the switches are the command's; Ctrl-C as above.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml

from bench.entry_points import answers_a_completion, config_copy
from bench.lib.serve_cluster import free_port
from deployments.fast_path import FAST_PATH_ENV, enable_for_serve_run, fast_path_warning, is_serve_run
from deployments.processes import LAUNCH_ENV as MARK_ENV
from deployments.processes import end_processes, marked_processes, port_holders, port_is_free, process_name
from tests.deployments.launched import ray_and_haproxy_processes

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
OPTIONS = {"model": "tiny-random", "max_num_seqs": 8, "max_model_len": 256}
START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 120.0
EXIT_LINGER_S = 15.0
"""How long a process of the stopped server may still take to exit once the command has: Ray's ``serve
run`` returns before every process of its local cluster has (a dashboard process outlived it under load)."""
SERVE_RUN_PORT = 8000
"""What ``serve run <import path>`` serves on (Ray 2.60 has no option for it)."""


def ray_start_environment(cluster_file: str) -> dict[str, str]:
    """The ``NAME=value`` assignments before ``ray start`` on the head line of a cluster file."""
    commands = yaml.safe_load((ROOT / cluster_file).read_text())["head_start_ray_commands"]
    line = next(command for command in commands if "ray start" in command)
    words = shlex.split(line.split("&&", 1)[1].split("ray start", 1)[0])
    return dict(word.split("=", 1) for word in words if "=" in word)


@pytest.mark.parametrize("cluster_file", ["cluster.yaml", "cluster-local.yaml"])
def test_every_ray_start_of_the_cluster_files_turns_the_fast_path_on(cluster_file):
    config = yaml.safe_load((ROOT / cluster_file).read_text())
    lines = [c for key in ("head_start_ray_commands", "worker_start_ray_commands") for c in config[key] if "ray start" in c]
    assert len(lines) == 2
    for line in lines:
        assert all(f"{name}={value}" in line for name, value in FAST_PATH_ENV.items()), line


def test_the_serve_config_documents_the_environment_that_serves_it_fast():
    switches = " ".join(f"{name}={value}" for name, value in FAST_PATH_ENV.items())
    assert f"{switches} serve run serve_config.yaml" in (ROOT / "serve_config.yaml").read_text()


def test_only_serve_run_is_switched_and_the_operator_choice_stands(monkeypatch):
    assert is_serve_run(["/x/.venv/bin/serve", "run", "deployments:app"])
    assert not is_serve_run(["/x/.venv/bin/serve", "deploy", "serve_config.yaml"]) and not is_serve_run(["pytest", "run"])
    environ: dict[str, str] = {}
    assert not enable_for_serve_run(environ, ["pytest"]) and environ == {}
    operator = {"RAY_SERVE_ENABLE_HA_PROXY": "0", "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.1"}
    assert enable_for_serve_run(operator, ["serve", "run", "deployments:app"])
    quiet = {"RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000", "RAY_SERVE_HAPROXY_NBTHREAD": str(min(4, os.cpu_count() or 1))}
    # no HAProxy, so no HAProxy files; the operator's control loop interval kept
    assert operator == {"RAY_SERVE_ENABLE_HA_PROXY": "0", "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"} | quiet
    assert "RAY_SERVE_ENABLE_HA_PROXY" in fast_path_warning(operator)
    assert fast_path_warning(dict(FAST_PATH_ENV)) is None


@pytest.fixture
def ray_dir() -> Iterator[str]:
    """Ray's files for one launch, in a short path of their own (Ray's socket paths must fit; no
    cluster address file in /tmp/ray that a later ``ray.init()`` would connect to)."""
    folder = tempfile.mkdtemp(prefix="spout-ray-", dir="/tmp")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def front_processes(port: int) -> set[str]:
    return {process_name(p) for p in port_holders(port)}


def wait_answering(port: int, what: subprocess.Popen | None, log: Path) -> None:
    """Until a completion is answered on ``port`` (``what`` still running, if given)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        assert what is None or what.poll() is None, f"exited with {what.returncode}:\n{tail(log)}"
        assert time.monotonic() < deadline, f"no answer on port {port} after {START_TIMEOUT_S:.0f} s:\n{tail(log)}"
        if answers_a_completion(port, "tiny-random"):
            return
        time.sleep(1)


def tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""


def documented_serve_run_environment() -> dict[str, str]:
    """The ``NAME=value`` words before ``serve run serve_config.yaml`` in the config's header."""
    line = next(line for line in (ROOT / "serve_config.yaml").read_text().splitlines() if "serve run serve_config.yaml`." in line)
    words = shlex.split(line.split("`")[1].split("serve run", 1)[0])
    return dict(word.split("=", 1) for word in words)


def run_and_ctrl_c(command: list[str], env: dict[str, str], port: int, log: Path) -> None:
    """Start ``command`` in a process group of its own (a terminal's job: Ctrl-C goes to all of it),
    check HAProxy answers on ``port``, Ctrl-C it: status 0, no "Aborted", nothing of it left."""
    before = ray_and_haproxy_processes()
    with log.open("wb") as out:
        serving = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    tree: list[psutil.Process] = []
    try:
        wait_answering(port, serving, log)
        tree = psutil.Process(serving.pid).children(recursive=True)
        assert front_processes(port) == {"haproxy"}, tail(log)
        os.killpg(serving.pid, signal.SIGINT)
        status = serving.wait(timeout=STOP_TIMEOUT_S)
    finally:
        if serving.poll() is None:
            os.killpg(serving.pid, signal.SIGKILL)
    output = log.read_text(errors="replace")
    assert status == 0 and "Aborted" not in output, tail(log)
    _, left = psutil.wait_procs([*tree, *(ray_and_haproxy_processes() - before)], timeout=EXIT_LINGER_S)
    left = [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, left


def local_environment(ray_dir: str) -> dict[str, str]:
    """This process's environment without the fast path's switches, HAProxy's side ports free, Ray's
    files in ``ray_dir``; a stopping replica's port closed at once (Serve keeps it open 30 s for HAProxy
    to stop sending to it, which makes Ctrl-C take that long: 0 keeps the tests short)."""
    env = os.environ | {"RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()), "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port()), "RAY_TMPDIR": ray_dir}
    return {name: value for name, value in env.items() if name not in FAST_PATH_ENV} | {"RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0"}


@pytest.mark.timeout(START_TIMEOUT_S + STOP_TIMEOUT_S + 60)
def test_serve_run_of_the_import_path_serves_through_haproxy_and_ctrl_c_ends_it(tmp_path, ray_dir):
    if not port_is_free("127.0.0.1", SERVE_RUN_PORT):
        pytest.skip(f"serve run serves on port {SERVE_RUN_PORT}, which is taken")
    command = [str(BIN / "serve"), "run", "deployments:build_app", *(f"{key}={value}" for key, value in OPTIONS.items())]
    run_and_ctrl_c(command, local_environment(ray_dir), SERVE_RUN_PORT, tmp_path / "serve_run.log")


@pytest.mark.timeout(START_TIMEOUT_S + STOP_TIMEOUT_S + 60)
def test_serve_run_of_the_config_with_its_documented_environment_serves_through_haproxy(tmp_path, ray_dir):
    documented = documented_serve_run_environment()
    assert documented == FAST_PATH_ENV
    port = free_port()
    env = local_environment(ray_dir) | documented
    run_and_ctrl_c([str(BIN / "serve"), "run", str(config_copy(tmp_path, OPTIONS, port))], env, port, tmp_path / "serve_run.log")


@pytest.mark.timeout(START_TIMEOUT_S + STOP_TIMEOUT_S + 60)
def test_serve_deploy_on_a_cluster_started_as_cluster_yaml_serves_through_haproxy(tmp_path, ray_dir):
    mark = {MARK_ENV: str(os.getpid())}
    token = tmp_path / "ray_token"
    token.write_text("0" * 64)
    cluster_env = ray_start_environment("cluster.yaml")
    assert cluster_env.items() >= FAST_PATH_ENV.items()
    env = (
        os.environ
        | {name: value for name, value in cluster_env.items() if name.startswith("RAY_SERVE_")}
        | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "RAY_TMPDIR": ray_dir}
        | {"RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()), "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port())}
        | mark
    )
    env.pop("RAY_ADDRESS", None)
    port, dashboard = free_port(), free_port()
    config = config_copy(tmp_path, OPTIONS, port)
    log = tmp_path / "cluster.log"
    try:
        with log.open("ab") as out:
            start = [str(BIN / "ray"), "start", "--head", f"--port={free_port()}", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}"]
            subprocess.run(
                start + ["--node-ip-address=127.0.0.1", f"--temp-dir={ray_dir}"], env=env, stdout=out, stderr=out, timeout=START_TIMEOUT_S, check=True
            )
            deploy = [str(BIN / "serve"), "deploy", str(config), "-a", f"http://127.0.0.1:{dashboard}"]
            subprocess.run(deploy, cwd=ROOT, env=env, stdout=out, stderr=out, timeout=START_TIMEOUT_S, check=True)
        wait_answering(port, None, log)
        assert front_processes(port) == {"haproxy"}, tail(log)
    finally:
        left = end_processes(marked_processes(os.getpid()))
    assert not left, left
