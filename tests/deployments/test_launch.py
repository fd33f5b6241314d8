"""`deployments.launch` without Ray: its command line, the one-line refusal of a port in use, the
end of what a dead launcher left, and the stop signals it takes. (`test_life_cycle.py` runs it.)"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from deployments.config import ServeArgs
from deployments.launch import StopSignals, check_authenticated, clear_stale_launches, parse_args, parse_options, replica_front, taken_port_warning
from deployments.processes import LAUNCH_ENV, ephemeral_ports, marked_processes, process_environ, taken_port_ranges
from tests.deployments.launched import Ports

ROOT = Path(__file__).resolve().parents[2]


def test_options_are_key_value_pairs_build_app_accepts():
    options = parse_options(["model=tiny-random", "max_num_seqs=64", "served_model_name=a=b"])
    assert options == {"model": "tiny-random", "max_num_seqs": "64", "served_model_name": "a=b"}
    assert ServeArgs(**options).max_num_seqs == 64


@pytest.mark.parametrize("pair", ["model", "=tiny-random"])
def test_a_pair_without_a_key_or_value_is_refused(pair):
    with pytest.raises(SystemExit, match="key=value"):
        parse_options([pair])


def test_a_port_in_use_is_one_line_that_names_its_holder():
    ports = Ports()
    env = os.environ | {"RAY_SERVE_HAPROXY_STATS_PORT": str(ports.stats), "RAY_SERVE_HAPROXY_METRICS_PORT": str(ports.metrics)}
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", ports.serve))
        listener.listen()
        command = [sys.executable, "-m", "deployments.launch", "--port", str(ports.serve)]
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"port {ports.serve} is in use by pid {os.getpid()} ({psutil.Process().name()}): stop that process or give this one another port"
    ]


def test_a_port_a_running_spout_holds_is_named_with_the_way_to_stop_it():
    ports = Ports()
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "deployments.launch"])  # its command line names the launcher
    listen = f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {ports.serve})); s.listen(); print(flush=True); time.sleep(120)"
    holder = subprocess.Popen([sys.executable, "-c", listen], env=os.environ | {LAUNCH_ENV: str(launcher.pid)}, stdout=subprocess.PIPE)
    try:
        holder.stdout.readline()  # listening
        env = os.environ | {"RAY_SERVE_HAPROXY_STATS_PORT": str(ports.stats), "RAY_SERVE_HAPROXY_METRICS_PORT": str(ports.metrics)}
        command = [sys.executable, "-m", "deployments.launch", "--port", str(ports.serve)]
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    finally:
        holder.kill()
        launcher.kill()
    assert done.returncode == 1
    assert done.stderr.startswith(f"port {ports.serve} is held by a running Spout (pid {holder.pid} ")
    assert done.stderr.rstrip().endswith("stop it with `make stop` (or Ctrl-C where it runs)")


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def wait_for_its_environment(process: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """Until ``process``'s environment can be read. Popen returns once the child has begun its exec, and for
    a moment after that /proc/<pid>/environ can still be empty (the kernel sets the new environment up
    after the parent resumes): on a loaded machine about one read in five right after Popen misses it."""
    deadline = time.monotonic() + timeout_s
    while LAUNCH_ENV not in psutil.Process(process.pid).environ():
        assert time.monotonic() < deadline, "the child's environment never showed its mark"
        time.sleep(0.01)


def test_a_start_ends_what_a_dead_launcher_left(capsys):
    left = subprocess.Popen(["sleep", "600"], env=os.environ | {LAUNCH_ENV: str(dead_pid())})
    try:
        wait_for_its_environment(left)
        clear_stale_launches()
        left.wait(timeout=10)  # reaped by then: its status is gone
        assert not psutil.pid_exists(left.pid)
    finally:
        left.kill()
    assert "Ended 1 processes an earlier Spout" in capsys.readouterr().out


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_each_stop_signal_is_counted_not_fatal(signum):
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        stops = StopSignals()
        os.kill(os.getpid(), signum)
        os.kill(os.getpid(), signum)
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    assert (stops.count, stops.first) == (2, signal.Signals(signum).name)


@pytest.mark.parametrize(
    ("argv", "environ", "refused"),
    [
        (["--host", "0.0.0.0"], {}, True),
        (["--host", "192.0.2.7"], {}, True),
        (["--host", "example.org"], {}, True),
        (["--host", "0.0.0.0"], {"SPOUT_API_KEY": "k"}, False),
        (["--host", "0.0.0.0", "api_key=k"], {}, False),
        (["--host", "0.0.0.0", "--allow-unauthenticated"], {}, False),
        (["--host", "127.0.0.1"], {}, False),
        (["--host", "localhost"], {}, False),
        (["--host", "::1"], {}, False),
    ],
)
def test_other_machines_are_served_only_with_an_api_key_or_when_the_operator_says_so(argv, environ, refused):
    args = parse_args(argv)
    if refused:
        with pytest.raises(SystemExit, match="--allow-unauthenticated"):
            check_authenticated(args, environ)
    else:
        check_authenticated(args, environ)


def test_a_port_ray_may_take_first_is_warned_of(tmp_path):
    range_file = tmp_path / "ip_local_port_range"
    range_file.write_text("32768\t60999\n")
    ephemeral = ephemeral_ports(range_file)
    assert (ephemeral.start, ephemeral.stop) == (32768, 61000)
    assert ephemeral_ports(tmp_path / "missing") == range(0)
    ranges = taken_port_ranges({"RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": "30500"}, ephemeral)
    assert [taken_port_warning(port, ranges) for port in (8000, 8404, 9101, 29999, 30501)] == [None] * 5
    assert taken_port_warning(60999, ranges).startswith("warning: port 60999 is in the kernel's ephemeral range (net.ipv4.ip_local_port_range)")
    assert "(32768-60999)" in taken_port_warning(32768, ranges)
    assert "Serve's direct-ingress HTTP range, from which its replicas take ports (30000-30500)" in taken_port_warning(30000, ranges)


def test_make_run_serves_with_the_replica_front_unless_told_otherwise():
    assert replica_front(parse_args(["model=tiny-random"])) and parse_args([]).options == {"http_front": "replica"}
    assert not replica_front(parse_args(["http_front=serve"]))


CLEAR_TITLE_AREA = """
import ctypes, time
libc = ctypes.CDLL(None)
first = ctypes.c_void_p.in_dll(libc, "environ").value  # char **environ: at start-up, the strings in the area /proc reads
ctypes.memset(ctypes.c_void_p.from_address(first).value, 0, 20)  # the start of the area, as Ray's agents' long titles leave it
print("cleared", flush=True)
time.sleep(60)
"""


def test_a_process_whose_title_overwrote_the_start_of_its_environment_is_still_found_by_its_mark():
    """Ray's agents and dashboard modules (``setproctitle``) leave NULs at the start of /proc/<pid>/environ; psutil
    then reads no variable, and a Ctrl-C twice under the replica front once left both agents running."""
    env = {"A_FIRST": "x" * 30, LAUNCH_ENV: str(os.getpid() + 1_000_000), "PATH": os.environ["PATH"]}
    child = subprocess.Popen([sys.executable, "-c", CLEAR_TITLE_AREA], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "cleared"
        process = psutil.Process(child.pid)
        assert process_environ(process)[LAUNCH_ENV] == env[LAUNCH_ENV]
        assert [p.pid for p in marked_processes(int(env[LAUNCH_ENV]))] == [child.pid]
    finally:
        child.kill()
        child.wait()


def test_a_descendant_of_a_marked_process_belongs_to_its_launch_even_without_the_mark():
    """A Ray agent whose long title overwrote the mark itself is found as the raylet's child."""
    mark = str(os.getpid() + 2_000_000)
    code = "import subprocess, sys, time; subprocess.Popen(['sleep', '60'], env={}); print('spawned', flush=True); time.sleep(60)"
    parent = subprocess.Popen([sys.executable, "-c", code], env={LAUNCH_ENV: mark, "PATH": os.environ["PATH"]}, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "spawned"
        child = psutil.Process(parent.pid).children()[0]
        assert LAUNCH_ENV not in process_environ(child)
        assert sorted(p.pid for p in marked_processes(int(mark))) == sorted([parent.pid, child.pid])
    finally:
        for process in psutil.Process(parent.pid).children():
            process.kill()
        parent.kill()
        parent.wait()
