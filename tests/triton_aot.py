"""Compile a Triton kernel to a CUDA binary (sm_90) ahead of time, without a GPU.

The interpreter does not type-check like the compiler does, so this catches what only a
real compilation would. It runs in a subprocess because ``TRITON_INTERPRET`` is set in the
test process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = """
import importlib, json, sys
from triton import compile
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

module, name, signature, constexprs = json.loads(sys.argv[1])
kernel = getattr(importlib.import_module(module), name)
signature |= {arg: "constexpr" for arg in constexprs}
source = ASTSource(
    fn=kernel,
    signature={arg: signature[arg] for arg in kernel.arg_names},
    constexprs={(kernel.arg_names.index(arg),): value for arg, value in constexprs.items()},
)
binary = compile(source, target=GPUTarget("cuda", 90, 32))
assert binary.asm["cubin"], "no cubin"
print("ok")
"""


def assert_compiles_for_sm90(module: str, kernel: str, signature: dict[str, str], constexprs: dict[str, object], env: dict[str, str] | None = None) -> None:
    """``module.kernel`` with these argument types (``*fp32``, ``i64``, ...) and constexpr values compiles; skipped without ptxas,
    and on a CUDA machine, where the kernels' own tests compile them natively (and this compilation outran
    `make gpu-check`'s test limit on an H200)."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the kernel's tests compile it for this device")
    environ = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | (env or {})
    root = Path(__file__).resolve().parents[1]
    environ["PYTHONPATH"] = os.pathsep.join([str(root), environ.get("PYTHONPATH", "")])
    arguments = json.dumps([module, kernel, signature, constexprs])
    result = subprocess.run([sys.executable, "-c", SCRIPT, arguments], env=environ, capture_output=True, text=True, timeout=300)
    if "ptxas" in result.stderr and "not found" in result.stderr:
        pytest.skip("no ptxas in this Triton installation")
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
