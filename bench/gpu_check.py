"""One prepared GPU run: everything a few minutes on a bare CUDA machine should measure, in one command.

On the CPU machine, ``make gpu-prepare`` (``python -m bench.gpu_check prepare``) downloads the wheels
the engine imports that a bare GPU machine lacks (for its Python 3.12, at the versions installed here)
into ``.gpu/wheels`` and exports the default model's tokenizer to ``.gpu/tokenizer`` (its 98 MB GGUF
is too large to carry). On the GPU machine, ``make gpu-check OUT=DIR`` (``python -m bench.gpu_check
run --out DIR``) installs those wheels into ``.gpu/site``, then runs each step below as its own
process under its own time limit (540 s in all; SIGINT 20 s before it, so pytest prints its failures); a step that fails or runs out of time is
recorded and the run goes on:

- ``device_match``: greedy tokens on CUDA in float32 and bfloat16, eager and with graphs, against the CPU's;
- ``engine`` and ``engine_8b``: prefill and decode tokens/s at batch 1 to 256, eager and with CUDA
  graphs, the default model's shape in float32 and bfloat16 and a Llama-3-8B shape in bfloat16,
  random weights made on the GPU;
- ``sampler``: the sampler against the sort-based reference, B up to 256, V 49,152 and 128,256;
- ``engine_concurrency``: 64 and 256 streams, TTFT and tokens/s;
- ``tests``: tests/sampling and tests/engine on CUDA, failures listed.

DIR receives ``gpu_check.log`` (every step's output), ``gpu_check.json`` (each step's command, exit
status and seconds, the failed tests, the machine) and each benchmark's ``<step>_cuda.json``: at most
8 files. ``--dry-run`` runs the same steps on the CPU at tiny sizes; CI runs it, so the script
never breaks unseen.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.lib.common import machine_info

REPO = Path(__file__).resolve().parent.parent
PREPARED = REPO / ".gpu"
WHEELS = PREPARED / "wheels"
SITE = PREPARED / "site"
TOKENIZER = PREPARED / "tokenizer"

CARRIED_PACKAGES = (
    *("pydantic", "pydantic_core", "annotated-types", "typing-inspection", "typing_extensions", "gguf", "llguidance"),
    *("jsonschema", "jsonschema-specifications", "referencing", "rpds-py"),  # the tests'
)
"""What the engine, its tests and its benchmarks import that the GPU machine's image lacks (or has too old)."""
DEVICE_PYTHON = "3.12"
INTERRUPT_GRACE_S = 20
"""Seconds a step has between SIGINT and its time limit (pytest writes its failures' tracebacks then)."""
RUN_LOGS = REPO / "bench" / "results" / "gpu_check"
"""The committed logs of earlier GPU runs (``runN.log``, ``runN_tests.log``)."""
CPU_ONLY_TESTS = ("tests/engine/test_gguf_loader.py", "tests/engine/test_gguf_tokenizer.py")
"""They need the default model's GGUF, which a GPU run does not carry."""
TEST_RESULT = re.compile(r"(tests/\S+?\.py)::\S*\s+(?:PASSED|FAILED|SKIPPED|ERROR)\b|\b(?:PASSED|FAILED|SKIPPED|ERROR)\s+(tests/\S+?\.py)::")
"""A test's result in pytest -v output: ``path::name PASSED`` or, in an xdist worker, ``PASSED path::name``."""
DEVICE_PLATFORMS = ("manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


@dataclass(frozen=True)
class Step:
    name: str
    command: list[str]
    timeout_s: float


@dataclass
class StepResult:
    name: str
    command: list[str]
    returncode: int | None
    """None: killed at its time limit."""
    seconds: float
    failed_tests: list[str]


def steps(out: Path, dry_run: bool, test_paths: list[str] | None = None) -> list[Step]:
    """The run's steps, most wanted first; ``dry_run``: the same on the CPU at tiny sizes.
    A benchmark step ``name`` writes ``out/<name>_cuda.json``; ``test_paths``: what the tests step
    runs (default: every CUDA test, `cuda_test_order`)."""

    def bench(name: str, module: str, arguments: str, timeout_s: float) -> Step:
        return Step(name, [sys.executable, "-m", module, *arguments.split(), "--out", str(out / f"{name}_cuda.json")], timeout_s)

    def tests(arguments: str, timeout_s: float) -> Step:
        # In a pytest-xdist worker where the image has it: a test that breaks the CUDA context ends its
        # worker (tests/conftest.py), which xdist replaces, so the tests after it still run.
        worker = ["-n", "1"] if importlib.util.find_spec("xdist") else []
        return Step("tests", [sys.executable, "-m", "pytest", "-v", "--tb=short", "-p", "no:cacheprovider", "-rfE", *worker, *arguments.split()], timeout_s)

    if dry_run:
        tiny = "--device cpu --model tiny-random"
        return [
            bench("device_match", "bench.device_match", f"{tiny} --prompts 2 --tokens 4", 300),
            bench("engine", "bench.engine", f"{tiny} --quick --dtype float32 --batch 1 2 --profile-steps 2", 300),
            bench("sampler", "bench.sampler", "--device cpu --batch 1 --vocab 4096 --budget-s 0 --profile-calls 2", 300),
            bench("engine_concurrency", "bench.engine_concurrency", f"{tiny} --quick", 300),
            tests("tests/sampling/test_sampling_params.py", 300),
        ]
    return [
        bench("device_match", "bench.device_match", "--device cuda", 75),
        bench("engine", "bench.engine", "--device cuda --model smollm2-shape-random --profile-steps 8", 80),
        bench("engine_8b", "bench.engine", "--device cuda --model llama3-8b-shape-random --dtype bfloat16 --profile-steps 8", 60),
        bench("sampler", "bench.sampler", "--device cuda --batch 1 32 128 256 --vocab 49152 128256 --budget-s 0.1 --profile-calls 5", 70),
        bench("engine_concurrency", "bench.engine_concurrency", "--device cuda --model smollm2-shape-random", 55),
        tests(
            f"--timeout=120 {' '.join(test_paths or cuda_test_order())}",
            200,
        ),
    ]


def cuda_test_order(run_logs: Path = RUN_LOGS) -> list[str]:
    """The CUDA test files, those least recently run on a GPU first: never-run ones, then by the last
    committed run log (``run_logs/runN*.log``, pytest -v output) that reports a result of theirs. A run
    stops at its limit after a third of the tests, so each GPU session goes on where the last stopped."""
    files = sorted(str(path.relative_to(REPO)) for folder in ("sampling", "engine") for path in (REPO / "tests" / folder).glob("test_*.py"))
    last_run = last_run_of_each_test_file(run_logs)
    return sorted((path for path in files if path not in CPU_ONLY_TESTS), key=lambda path: last_run.get(path, -1))


def last_run_of_each_test_file(run_logs: Path) -> dict[str, int]:
    """Test file -> the highest N of a ``runN*.log`` in which one of its tests passed, failed or skipped."""
    last_run: dict[str, int] = {}
    for log in run_logs.glob("run*.log"):
        run = int(re.match(r"run(\d+)", log.name).group(1))
        for match in TEST_RESULT.finditer(log.read_text(errors="replace")):
            path = match.group(1) or match.group(2)
            last_run[path] = max(run, last_run.get(path, -1))
    return last_run


def step_environment(site: Path | None, dry_run: bool) -> dict[str, str]:
    """The carried wheels (``site``) and the repository on the path; the exported tokenizer where the
    default model is not installed; on the device, no C++ CPU kernel built (the CPU references would
    spend minutes building them: the first H200 run of this script lost two steps to it). Called once
    the wheels are installed: the loader imports some of them."""
    if site:
        sys.path.insert(0, str(site))
    from engine.kernels.build import DISABLE_ENV
    from engine.loader.model_files import DEFAULT_MODEL_PACKAGE, DEFAULT_TOKENIZER_ENV

    env = dict(os.environ)
    if not dry_run:
        env[DISABLE_ENV] = "0"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site or ""), str(REPO), env.get("PYTHONPATH", "")) if p)
    if importlib.util.find_spec(DEFAULT_MODEL_PACKAGE) is None and TOKENIZER.exists():
        env[DEFAULT_TOKENIZER_ENV] = str(TOKENIZER)
    return env


def run_step(step: Step, env: dict[str, str], log) -> StepResult:
    log.write(f"\n===== {step.name}: {' '.join(step.command)} (limit {step.timeout_s:.0f} s)\n")
    log.flush()
    started = time.perf_counter()
    output, returncode = run_interrupted_at_limit(step.command, env, step.timeout_s)
    seconds = time.perf_counter() - started
    log.write(output)
    log.write(f"===== {step.name}: exit {returncode} after {seconds:.1f} s\n")
    log.flush()
    failed = failed_tests(output)
    print(f"{step.name}: exit {returncode} after {seconds:.1f} s" + (f", {len(failed)} failed" if failed else ""), flush=True)
    return StepResult(step.name, step.command, returncode, round(seconds, 1), failed)


def run_interrupted_at_limit(command: list[str], env: dict[str, str], timeout_s: float) -> tuple[str, int | None]:
    """(output, exit status or None when stopped at the limit). At ``timeout_s - INTERRUPT_GRACE_S`` the
    step gets SIGINT, so pytest prints the tracebacks of what failed so far; it is killed at ``timeout_s``."""
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        return process.communicate(timeout=max(timeout_s - INTERRUPT_GRACE_S, 1))[0], process.returncode
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)
    try:
        output = process.communicate(timeout=INTERRUPT_GRACE_S)[0]
    except subprocess.TimeoutExpired:
        process.kill()
        output = process.communicate()[0]
    return output, None


def failed_tests(pytest_output: str) -> list[str]:
    """The ids of the tests that failed or errored, from pytest's -v lines (which a run killed at
    its time limit has written as far as it got) and its closing summary."""
    failed = set()
    for line in pytest_output.splitlines():
        words = line.split()
        for outcome, test in zip(words, words[1:]):  # the summary's and pytest-xdist's ("[gw0] [ 5%] FAILED tests/...")
            if outcome in ("FAILED", "ERROR") and test.startswith("tests/"):  # a collection error names a file
                failed.add(test)
        if len(words) >= 2 and "::" in words[0] and words[1] in ("FAILED", "ERROR"):
            failed.add(words[0])
    return sorted(failed)


def install_wheels(log) -> Path | None:
    """Install the carried wheels into .gpu/site (no index, no dependencies: they were chosen on the
    CPU machine); the folder, or None where none were carried."""
    wheels = sorted(WHEELS.glob("*.whl")) if WHEELS.exists() else []
    if not wheels:
        return None
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--upgrade", "--target", str(SITE), *map(str, wheels)]
    completed = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    log.write(f"===== install: {len(wheels)} wheels, exit {completed.returncode}\n{completed.stdout}")
    return SITE


def run(out: Path, dry_run: bool, only: list[str] | None = None, test_paths: list[str] | None = None) -> list[StepResult]:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "gpu_check.log", "w") as log:
        site = None if dry_run else install_wheels(log)  # a dry run uses this machine's own packages
        env = step_environment(site, dry_run)
        results = [run_step(step, env, log) for step in steps(out, dry_run, test_paths) if not only or step.name in only]
    summary = {"machine": machine_info(), "dry_run": dry_run, "steps": [asdict(result) for result in results]}
    (out / "gpu_check.json").write_text(json.dumps(summary, indent=2) + "\n")
    return results


def prepare() -> None:
    """Download the carried wheels at this machine's versions, for the GPU machine's Python, and export the tokenizer."""
    from engine.loader.model_files import export_default_tokenizer

    WHEELS.mkdir(parents=True, exist_ok=True)
    for stale in WHEELS.glob("*.whl"):
        stale.unlink()
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in CARRIED_PACKAGES]
    platforms = [flag for platform in DEVICE_PLATFORMS for flag in ("--platform", platform)]
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", DEVICE_PYTHON]
    subprocess.run([*command, "--implementation", "cp", *platforms, "--platform", "any", "-d", str(WHEELS), *pins], check=True)
    export_default_tokenizer(TOKENIZER)
    print(f"prepared {len(list(WHEELS.glob('*.whl')))} wheels in {WHEELS} and the tokenizer in {TOKENIZER}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("prepare", help="on the CPU machine: the wheels and tokenizer a bare GPU machine needs, in .gpu/")
    check = commands.add_parser("run", help="on the GPU machine: every step, results in --out")
    check.add_argument("--out", type=Path, required=True)
    check.add_argument("--dry-run", action="store_true", help="the same steps on the CPU at tiny sizes")
    check.add_argument("--only", nargs="+", default=None, metavar="STEP", help="run these steps alone (a rerun of those that failed)")
    check.add_argument("--tests", nargs="+", default=None, metavar="PATH", help="the tests step runs these (default: every CUDA test)")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare()
    else:
        results = run(args.out, args.dry_run, args.only, args.tests)
        print(f"{sum(r.returncode == 0 for r in results)} of {len(results)} steps passed; results in {args.out}")


if __name__ == "__main__":
    main()
