"""What every benchmark shares: the machine it ran on, a printed table, JSON under bench/results/."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import torch

RESULTS_DIR = Path(__file__).parent / "results"


def machine_info() -> dict[str, object]:
    info: dict[str, object] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def print_table(rows: list[dict[str, object]]) -> None:
    if not rows:
        return
    columns = list(rows[0])
    cells = [[_format(row[c]) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))


def _format(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def write_results(name: str, rows: list[dict[str, object]], **extra: object) -> Path:
    """Write ``{"machine", "rows", **extra}`` to bench/results/<name>.json and return the path."""
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps({"machine": machine_info(), **extra, "rows": rows}, indent=2) + "\n")
    return path
