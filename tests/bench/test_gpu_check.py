"""`make gpu-check`'s script: its dry run on the CPU runs every step, and the full run fits a device call."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench import gpu_check
from bench.gpu_check import failed_tests, run_interrupted_at_limit, steps

DEVICE_CALL_S = 600
"""One command on a lent GPU machine runs at most this long; the steps' limits must leave room for installing the wheels."""
MAX_FILES = 8
"""Files a device call brings back."""


def test_full_run_fits_one_device_call(tmp_path):
    full = steps(tmp_path, dry_run=False)
    assert sum(step.timeout_s for step in full) <= DEVICE_CALL_S - 60
    outputs = {word for step in full for word in step.command if word.startswith(str(tmp_path))}
    assert len(outputs) + 2 <= MAX_FILES  # the benchmarks' JSON, the log and the summary
    assert all(step.command.count("cuda") == 1 for step in full if step.name != "tests")
    assert {step.name for step in full} >= {step.name for step in steps(tmp_path, dry_run=True)}


def test_the_tests_step_runs_the_paths_asked_for(tmp_path):
    (default,) = [step for step in steps(tmp_path, dry_run=False) if step.name == "tests"]
    (chosen,) = [step for step in steps(tmp_path, dry_run=False, test_paths=["tests/engine/test_a.py"]) if step.name == "tests"]
    assert "tests/engine/test_engine_core.py" in default.command and "tests/engine/test_engine_core.py" not in chosen.command
    assert "tests/engine/test_a.py" in chosen.command
    assert not set(gpu_check.CPU_ONLY_TESTS) & set(default.command)


def test_the_tests_least_recently_run_on_a_gpu_come_first(tmp_path):
    (tmp_path / "run2.log").write_text("tests/engine/test_engine_core.py::test_x PASSED [ 1%]\ntests/sampling/test_top_set.py::test_y FAILED [ 2%]\n")
    (tmp_path / "run10_tests.log").write_text("[gw0] [ 3%] SKIPPED tests/sampling/test_top_set.py::test_z \n")
    (tmp_path / "run9.log").write_text("tests/engine/test_batching.py::test_w ERROR\ncollected tests/engine/test_block_pool.py::\n")
    assert gpu_check.last_run_of_each_test_file(tmp_path) == {
        "tests/engine/test_engine_core.py": 2,
        "tests/sampling/test_top_set.py": 10,
        "tests/engine/test_batching.py": 9,
    }
    order = gpu_check.cuda_test_order(tmp_path)
    ran = ["tests/engine/test_engine_core.py", "tests/engine/test_batching.py", "tests/sampling/test_top_set.py"]
    assert order[-3:] == ran
    assert "tests/engine/test_block_pool.py" in order[:-3]


def test_a_step_at_its_limit_is_interrupted_first_so_pytest_can_report(monkeypatch):
    monkeypatch.setattr(gpu_check, "INTERRUPT_GRACE_S", 5)
    sleeper = "import time\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    print('interrupted, reporting')"
    # SIGINT 5 s after the start (timeout less grace): time for the interpreter to start and enter the try, even on a loaded machine.
    output, returncode = run_interrupted_at_limit([sys.executable, "-c", sleeper], {}, timeout_s=10)
    assert returncode is None
    assert "interrupted, reporting" in output


def test_failed_tests_are_read_from_verbose_lines_and_the_summary():
    output = "\n".join(
        [
            "tests/a.py::test_one PASSED    [ 10%]",
            "tests/a.py::test_two FAILED    [ 20%]",
            "tests/b.py::test_three[x-1] ERROR [ 30%]",
            "FAILED tests/a.py::test_two - AssertionError: 1 != 2",
            "FAILED tests/c.py::test_four - RuntimeError",
            "ERROR tests/d.py",
            "[gw0] [ 40%] FAILED tests/e.py::test_five ",
            "[gw1] node down: Not properly terminated",
            "FAILED tests/f.py::test_six",
        ]
    )
    expected = ["tests/a.py::test_two", "tests/b.py::test_three[x-1]", "tests/c.py::test_four", "tests/d.py", "tests/e.py::test_five", "tests/f.py::test_six"]
    assert failed_tests(output) == expected


def test_dry_run_runs_every_step_and_writes_its_files(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "bench.gpu_check", "run", "--dry-run", "--out", str(tmp_path)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    assert summary["dry_run"] is True
    assert [step["name"] for step in summary["steps"]] == [step.name for step in steps(tmp_path, dry_run=True)]
    assert all(step["returncode"] == 0 and not step["failed_tests"] for step in summary["steps"]), summary["steps"]
    written = sorted(path.name for path in tmp_path.iterdir())
    assert written == sorted(
        ["gpu_check.json", "gpu_check.log", "device_match_cuda.json", "engine_cuda.json", "sampler_cuda.json", "engine_concurrency_cuda.json"]
    )
    assert len(written) <= MAX_FILES
    engine_rows = json.loads((tmp_path / "engine_cuda.json").read_text())["rows"]
    assert {row["phase"] for row in engine_rows} == {"prefill", "decode"} and all(row["tokens_per_s"] > 0 for row in engine_rows)


def test_the_device_builds_no_cpu_kernel_and_a_dry_run_does(monkeypatch):
    """On the device the CPU reference engines would spend minutes compiling `engine/kernels`: the steps' environment says not to."""
    from engine.kernels.build import DISABLE_ENV, load_kernel

    assert gpu_check.step_environment(None, dry_run=False)[DISABLE_ENV] == "0"
    monkeypatch.delenv(DISABLE_ENV, raising=False)
    assert DISABLE_ENV not in gpu_check.step_environment(None, dry_run=True)
    monkeypatch.setenv(DISABLE_ENV, "0")
    assert load_kernel("rms_norm", "torch's norm") is None
