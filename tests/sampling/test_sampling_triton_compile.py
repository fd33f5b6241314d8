"""The kernel compiles to a CUDA binary (sm_90) ahead of time, without a GPU.

The interpreter does not type-check like the compiler does, so this catches what only a
real compilation would. It runs in a subprocess because ``TRITON_INTERPRET`` is set here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
from triton import compile
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sampling.triton.kernels import truncate_and_draw_kernel as kernel

pointers = ["logits_ptr", "min_p_ptr", "top_p_ptr", "typical_p_ptr", "n_sigma_ptr", "xtc_threshold_ptr",
            "xtc_probability_ptr", "processed_ptr"]
signature = {name: "*fp32" for name in pointers}
signature |= {"top_k_ptr": "*i64", "key_ptr": "*i64", "draft_ptr": "*i64", "token_ptr": "*i64", "accepted_ptr": "*i8",
              "stride": "i64", "n_rows": "i32", "V": "i32"}
flags = ["HAS_MIN_P", "HAS_TOP_K", "HAS_TOP_P", "HAS_TYPICAL_P", "HAS_TOP_N_SIGMA", "HAS_XTC", "HAS_DRAFTS",
         "WRITE_PROCESSED"]
constexprs = {**{name: True for name in flags}, "BLOCK_R": 2, "BLOCK_V": 4096}
signature |= {name: "constexpr" for name in constexprs}
source = ASTSource(
    fn=kernel,
    signature={name: signature[name] for name in kernel.arg_names},
    constexprs={(kernel.arg_names.index(name),): value for name, value in constexprs.items()},
)
binary = compile(source, target=GPUTarget("cuda", 90, 32))
assert binary.asm["cubin"], "no cubin"
print("ok")
"""


def test_kernel_compiles_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    if "ptxas" in result.stderr and "not found" in result.stderr:
        pytest.skip("no ptxas in this Triton installation")
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
