"""Shared benchmark helpers: machine description and JSON results under ``bench/results/``."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

RESULTS_DIR = Path(__file__).parent / "results"


def machine_info() -> dict:
    """CPU, core count, OS and Python of the machine running the benchmark."""
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def write_results(name: str, rows: list[dict], **extra: object) -> Path:
    """Write ``{"machine": ..., **extra, "rows": rows}`` to ``bench/results/<name>.json``."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps({"machine": machine_info(), **extra, "rows": rows}, indent=2) + "\n")
    return path
