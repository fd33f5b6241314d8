"""`bench.entry_points` without starting a server: the commands each entry point is started with (the
fast path's switches where the user sets them, never inherited), the config copy, the rows and the
ratios to ``make run``'s."""

from __future__ import annotations

from pathlib import Path

import yaml

from bench.entry_points import SERVE_RUN_PORT, entry_points, entry_row, ratios_to_make_run
from bench.lib.load_client import StreamResult
from deployments.fast_path import FAST_PATH_ENV


def test_each_entry_point_is_started_as_a_user_starts_it(tmp_path, monkeypatch):
    for name, value in FAST_PATH_ENV.items():
        monkeypatch.setenv(name, value)  # the benchmark's own environment must not leak the switches
    points = {point.name: point for point in entry_points(Path("/models/tiny"), tmp_path, "/tmp/ray-x")}
    assert list(points) == ["make_run", "serve_run_import_path", "serve_run_config"]
    make_run, import_path, config = points.values()
    assert make_run.command[1:5] == ["-m", "deployments.launch", "--port", str(make_run.port)]
    assert "model=/models/tiny" in make_run.command and "model=/models/tiny" in import_path.command
    assert import_path.command[1:3] == ["run", "deployments:build_app"] and import_path.port == SERVE_RUN_PORT
    assert not any(name in make_run.environment for name in FAST_PATH_ENV)  # the launcher sets them itself
    assert not any(name in import_path.environment for name in FAST_PATH_ENV)  # so does the app under serve run
    assert config.environment.items() >= FAST_PATH_ENV.items()  # the config's header documents them
    written = yaml.safe_load(Path(config.command[2]).read_text())
    assert written["http_options"]["port"] == config.port and written["applications"][0]["args"]["model"] == "/models/tiny"
    assert all(point.environment["RAY_TMPDIR"] == "/tmp/ray-x" for point in points.values())


def test_rows_compare_texts_and_cpu_with_make_runs():
    def level(texts: list[str], front_s: float):
        results = [StreamResult(text=text, tokens=100, frames=100, ttft_s=0.01, gaps_s=[0.001] * 99) for text in texts]
        return (2, results, 0.5, {"ingress": front_s, "proxy": 0.0, "engine": 0.1}, 0.3)

    make_run = entry_row("make_run", level(["a", "b"], 0.01), ["a", "b"])
    serve_run = entry_row("serve_run_config", level(["a", "c"], 0.016), ["a", "b"])
    slow = entry_row("serve_run_import_path", level(["a", "b"], 0.02), ["a", "b"])
    assert make_run["cpu_us_per_token_front"] == 50.0 and make_run["differs_from_make_run"] == 0
    assert serve_run["server"] == "serve_run_config" and serve_run["differs_from_make_run"] == 1 and "differs_from_vllm" not in serve_run
    ratios = ratios_to_make_run([make_run, serve_run, slow])
    assert [(r["entry_point"], r["front_cpu_over_make_run"], r["within_goal"]) for r in ratios] == [
        ("serve_run_config", 1.6, False),
        ("serve_run_import_path", 2.0, False),
    ]
