"""The 4-bit and 8-bit block matmul kernels (``quant_matmul.cpp``), built once and loaded.

torch's own CPU kernels for 4-bit weights do not fit a float32 engine: on the default model's
576x1536 projection ``_weight_int4pack_mm_for_cpu`` with float32 activations was exact but 13x
slower than float32 ``F.linear`` at one row, and with bfloat16 activations it rounds them. The
kernel here keeps float32 activations and reads GGUF's blocks (see `engine.models.quant_linear`).

``python -m engine.kernels.quant_matmul`` builds it (``make install`` does); the first build takes
a few minutes (torch's headers), later loads a second. ``load()`` returns None, and says why in
the log, where it cannot be built (no C++ compiler): the engine then computes with the float32
weights the loader dequantized.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from types import ModuleType

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("quant_matmul.cpp")
BUILD_DIR = Path(__file__).resolve().parents[2] / ".cache" / "kernels" / "quant_matmul"
FLAGS = ["-O3", "-march=native", "-fopenmp"]
"""``-march=native``: the kernel's AVX-512 path where the CPU has it (a build belongs to its machine);
``-fopenmp``: ``at::parallel_for`` splits the weight rows over torch's intra-op threads."""


@functools.cache
def load() -> ModuleType | None:
    """The compiled module (``q4_matmul``, ``q8_matmul``), or None if it cannot be built here."""
    from torch.utils.cpp_extension import load as load_extension

    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    try:
        return load_extension(name="spout_quant_matmul", sources=[str(SOURCE)], extra_cflags=FLAGS, extra_ldflags=["-fopenmp"], build_directory=str(BUILD_DIR))
    except (OSError, RuntimeError, ImportError) as error:  # no compiler, no ninja, a failed build
        logger.warning("the quantized matmul kernel could not be built (%s): quantized weights are dequantized to float32", error)
        return None


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    print("quantized matmul kernel:", "built" if load() is not None else "unavailable")
