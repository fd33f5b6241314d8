"""The top-set kernel compiles to a CUDA binary (sm_90) ahead of time, without a GPU (`tests.triton_aot`)."""

from __future__ import annotations

import pytest

from tests.triton_aot import assert_compiles_for_sm90

SIGNATURE = {
    "logits_ptr": "*fp32",
    "stride": "i64",
    "temperature_ptr": "*fp32",
    "greedy_ptr": "*i1",
    "min_p_ptr": "*fp32",
    "top_k_ptr": "*i64",
    "top_p_ptr": "*fp32",
    "seed_key_ptr": "*i64",
    "has_seed_ptr": "*i1",
    "output_pos_ptr": "*i64",
    "random_key_ptr": "*i64",
    "token_ptr": "*i64",
    "passes_ptr": "*i32",
    "n_rows": "i32",
    "V": "i32",
}


@pytest.mark.parametrize("flags", [(True, True, True), (False, False, True), (False, True, False)])
def test_kernel_compiles_for_sm90(flags: tuple[bool, bool, bool]) -> None:
    has_min_p, has_top_k, has_top_p = flags
    constexprs = {"HAS_MIN_P": has_min_p, "HAS_TOP_K": has_top_k, "HAS_TOP_P": has_top_p, "BLOCK_R": 1, "BLOCK_V": 4096, "NUM_BINS": 64}
    assert_compiles_for_sm90("sampling.triton.top_set", "top_set_sample_kernel", SIGNATURE, constexprs, {"TRITON_DEFAULT_FP_FUSION": "1"})
