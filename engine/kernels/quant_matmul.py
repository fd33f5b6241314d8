"""The 4-bit and 8-bit block matmul kernels (``quant_matmul.cpp``), built once and loaded.

torch's own CPU kernels for 4-bit weights do not fit a float32 engine: on the default model's
576x1536 projection ``_weight_int4pack_mm_for_cpu`` with float32 activations was exact but 13x
slower than float32 ``F.linear`` at one row, and with bfloat16 activations it rounds them. The
kernel here keeps float32 activations and reads GGUF's blocks (see `engine.models.quant_linear`).

``python -m engine.kernels.quant_matmul`` builds it (``make install`` does; see
`engine.kernels.build`). ``load()`` returns None, and says why in the log, where it cannot be
built (no C++ compiler): the engine then computes with the float32 weights the loader dequantized.
"""

from __future__ import annotations

import functools
import logging
from types import ModuleType

from engine.kernels.build import load_kernel


@functools.cache
def load() -> ModuleType | None:
    """The compiled module (``q4_matmul``, ``q8_matmul``), or None if it cannot be built here."""
    return load_kernel("quant_matmul", "quantized weights are dequantized to float32")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    print("quantized matmul kernel:", "built" if load() is not None else "unavailable")
