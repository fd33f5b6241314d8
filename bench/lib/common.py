"""What every benchmark shares: the machine it ran on, a printed table, JSON under bench/results/."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
from pathlib import Path

import torch

RESULTS_DIR = Path(__file__).resolve().parent.parent / "results"


def machine_info() -> dict[str, object]:
    """CPU model, core count, OS, Python, torch and the GPU if there is one."""
    info: dict[str, object] = {
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _version("triton"),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
    return info


def _version(package: str) -> str | None:
    """An installed package's version; None where it is not installed (Triton: the ``cuda`` extra)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def device_label(device: torch.device) -> str:
    """``cpu``, or ``cuda:0 (<GPU name>)``: the device a benchmark row ran on."""
    return str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def quietness(load_average_before: float) -> dict[str, object]:
    """Whether the machine was quiet when the benchmark began (1-minute load average under 1)."""
    return {"load_average_before": round(load_average_before, 2), "quiet_machine": load_average_before < 1.0}


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


def write_results(name: str, rows: list[dict[str, object]], out: Path | None = None, **extra: object) -> Path:
    """Write ``{"machine", "rows", **extra}`` to ``out`` (default bench/results/<name>.json) and return the path."""
    path = out or RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine_info(), **extra, "rows": rows}, indent=2) + "\n")
    return path
