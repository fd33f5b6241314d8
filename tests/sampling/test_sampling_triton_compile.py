"""The kernel compiles to a CUDA binary (sm_90) ahead of time, without a GPU (`tests.triton_aot`)."""

from __future__ import annotations

from tests.triton_aot import assert_compiles_for_sm90

POINTERS = ["logits_ptr", "min_p_ptr", "top_p_ptr", "typical_p_ptr", "n_sigma_ptr", "xtc_threshold_ptr", "xtc_probability_ptr", "processed_ptr"]
SIGNATURE = {name: "*fp32" for name in POINTERS} | {
    "top_k_ptr": "*i64",
    "key_ptr": "*i64",
    "draft_ptr": "*i64",
    "token_ptr": "*i64",
    "accepted_ptr": "*i8",
    "stride": "i64",
    "n_rows": "i32",
    "V": "i32",
}
FLAGS = ["HAS_MIN_P", "HAS_TOP_K", "HAS_TOP_P", "HAS_TYPICAL_P", "HAS_TOP_N_SIGMA", "HAS_XTC", "HAS_DRAFTS", "WRITE_PROCESSED"]


def test_kernel_compiles_for_sm90() -> None:
    constexprs = {**{name: True for name in FLAGS}, "BLOCK_R": 2, "BLOCK_V": 4096}
    env = {"TRITON_DEFAULT_FP_FUSION": "1"}
    assert_compiles_for_sm90("sampling.triton.kernels", "truncate_and_draw_kernel", SIGNATURE, constexprs, env)
