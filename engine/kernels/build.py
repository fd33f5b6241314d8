"""Builds and loads a C++ kernel of ``engine/kernels`` with torch's extension builder, once per machine.

Each kernel's module (`engine.kernels.quant_matmul`, `engine.kernels.paged_attention`,
`engine.kernels.rope_cache`, `engine.kernels.rms_norm`, `engine.kernels.silu_mul`) calls
`load_kernel` from its own cached ``load()``. The build goes to ``.cache/kernels/<name>``; the
first one takes a few minutes (torch's headers), later loads a second.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import ModuleType

logger = logging.getLogger(__name__)

KERNELS_DIR = Path(__file__).resolve().parent
CACHE_DIR = KERNELS_DIR.parents[1] / ".cache" / "kernels"
DISABLE_ENV = "SPOUT_CPU_KERNELS"
"""Set to ``0``: build no kernel (a GPU machine, where a first build would take minutes of its time)."""
FLAGS = ["-O3", "-march=native", "-fopenmp"]
"""``-march=native``: the kernels' AVX-512 paths where the CPU has them (a build belongs to its machine);
``-fopenmp``: ``at::parallel_for`` splits the work over torch's intra-op threads."""


def load_kernel(name: str, fallback: str) -> ModuleType | None:
    """The compiled ``<name>.cpp`` (module ``spout_<name>``), or None, with a warning that ends in
    ``fallback`` (what the engine does without it), where it cannot be built here."""
    from torch.utils.cpp_extension import load as load_extension

    if os.environ.get(DISABLE_ENV) == "0":
        logger.warning("the %s kernel is not built (%s=0): %s", name, DISABLE_ENV, fallback)
        return None
    build_dir = CACHE_DIR / name
    build_dir.mkdir(parents=True, exist_ok=True)
    source = KERNELS_DIR / f"{name}.cpp"
    try:
        return load_extension(name=f"spout_{name}", sources=[str(source)], extra_cflags=FLAGS, extra_ldflags=["-fopenmp"], build_directory=str(build_dir))
    except (OSError, RuntimeError, ImportError) as error:  # no compiler, no ninja, a failed build
        logger.warning("the %s kernel could not be built (%s): %s", name, error, fallback)
        return None
