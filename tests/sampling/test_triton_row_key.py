"""The top-set kernel computes its rows' race keys itself (`sampling.triton.noise.row_key`): bit for bit
`sampling.ops.seeded_noise.row_keys`, for seeds over all 64 bits (negative ones included) and output
positions past 2**32; unseeded rows take the random key they are given."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st

from sampling.ops.seeded_noise import MASK32, row_keys, seed_key
from sampling.triton.noise import row_key

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EDGE_SEEDS = [0, 1, -1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, -(2**63), 2**64 - 1, 0x9E3779B97F4A7C15]


@triton.jit
def row_keys_kernel(seed_key_ptr, has_seed_ptr, output_pos_ptr, random_key_ptr, out_ptr, n, BLOCK: tl.constexpr):
    rows = tl.arange(0, BLOCK)
    mask = rows < n
    key = row_key(
        tl.load(seed_key_ptr + rows, mask=mask, other=0),
        tl.load(has_seed_ptr + rows, mask=mask, other=0) != 0,
        tl.load(output_pos_ptr + rows, mask=mask, other=0),
        tl.load(random_key_ptr + rows, mask=mask, other=0),
    )
    tl.store(out_ptr + rows, key.to(tl.int64), mask=mask)


def kernel_keys(seed_keys: torch.Tensor, has_seed: torch.Tensor, output_pos: torch.Tensor, random_keys: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(seed_keys)
    n = seed_keys.shape[0]
    row_keys_kernel[(1,)](seed_keys, has_seed, output_pos, random_keys, out, n, BLOCK=triton.next_power_of_2(n))
    return out


@settings(max_examples=60, deadline=None)
@given(
    seeds=st.lists(st.one_of(st.sampled_from(EDGE_SEEDS), st.integers(-(2**63), 2**64 - 1)), min_size=1, max_size=16),
    positions=st.lists(st.integers(0, 2**40), min_size=16, max_size=16),
)
def test_seeded_keys_are_the_torch_paths_bit_for_bit(seeds: list[int], positions: list[int]) -> None:
    n = len(seeds)
    seed_keys = torch.tensor([seed_key(s) for s in seeds], dtype=torch.int64, device=DEVICE)
    has_seed = torch.ones(n, dtype=torch.bool, device=DEVICE)
    output_pos = torch.tensor(positions[:n], dtype=torch.int64, device=DEVICE)
    random_keys = torch.zeros(n, dtype=torch.int64, device=DEVICE)
    assert torch.equal(kernel_keys(seed_keys, has_seed, output_pos, random_keys), row_keys(seed_keys, has_seed, output_pos))


def test_unseeded_rows_take_their_random_key() -> None:
    random_keys = torch.tensor([0, 1, 0x7FFFFFFF, 0x80000000, MASK32], dtype=torch.int64, device=DEVICE)
    seed_keys = torch.tensor([seed_key(7)] * 5, dtype=torch.int64, device=DEVICE)
    has_seed = torch.tensor([False, True, False, True, False], device=DEVICE)
    keys = kernel_keys(seed_keys, has_seed, torch.arange(5, device=DEVICE), random_keys)
    seeded = row_keys(seed_keys, torch.ones(5, dtype=torch.bool, device=DEVICE), torch.arange(5, device=DEVICE))
    assert torch.equal(keys, torch.where(has_seed, seeded, random_keys))
