"""The kernel's draft mode against the torch reference: the same emitted tokens, token for token."""

from __future__ import annotations

import pytest
import torch
from sampling_helpers import verify_layout

from sampling.batch import SamplingBatch
from sampling.params import SamplingParams
from sampling.sampler import Sampler

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MAX_DRAFTS = 8


def mixed_params(i: int) -> SamplingParams:
    """Greedy, unseeded and seeded rows over every truncation."""
    kinds = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.9),
        SamplingParams(top_k=20, top_p=0.9, seed=i),
        SamplingParams(min_p=0.02, typical_p=0.9, temperature=1.2, seed=i),
        SamplingParams(top_n_sigma=1.5, xtc_probability=0.5, xtc_threshold=0.05, seed=i),
        SamplingParams(top_p=0.8, repetition_penalty=1.3, frequency_penalty=0.3),
    ]
    return kinds[i % len(kinds)]


def drafts_for(logits: torch.Tensor, cu: list[int], g: torch.Generator) -> list[list[int]]:
    """Drafts per request (cu gives k_i + 1 rows): mostly the row's argmax, else its runner-up or a random token."""
    ranked = logits.topk(2, dim=-1).indices.cpu()
    drafts = []
    for i in range(len(cu) - 1):
        choice = torch.randint(0, 5, (cu[i + 1] - cu[i] - 1,), generator=g).clamp(min=2).sub(2).tolist()
        random = torch.randint(0, logits.shape[1], (len(choice),), generator=g).tolist()
        drafts.append([int(ranked[cu[i] + j, c]) if c < 2 else random[j] for j, c in enumerate(choice)])
    return drafts


@pytest.mark.parametrize("vocab, num_requests, scale, steps", [(300, 36, 4.0, 2), (5000, 9, 8.0, 1)])
def test_kernel_matches_torch_path(vocab: int, num_requests: int, scale: float, steps: int) -> None:
    """Mixed greedy / unseeded / seeded rows, k_i from 0 to 8; 5000 tokens span two kernel chunks."""
    params = [mixed_params(i) for i in range(num_requests)]
    batches = {}
    for use_triton in (False, True):
        batches[use_triton] = SamplingBatch(num_requests, vocab, 64, DEVICE)
        for row, p in enumerate(params):
            batches[use_triton].add_request(row, p, [1, 2, 3])
    counts = [i % (MAX_DRAFTS + 1) + 1 for i in range(num_requests)]
    cu = [0, *torch.tensor(counts).cumsum(0).tolist()]
    rows = torch.arange(num_requests, device=DEVICE)
    g = torch.Generator().manual_seed(0)
    emitted = []
    for step in range(steps):
        logits = (torch.randn(cu[-1], vocab, generator=g) * scale).to(DEVICE)
        draft_ids, cu_tensor = verify_layout(drafts_for(logits, cu, g))
        outputs = []
        for use_triton in (False, True):
            torch.manual_seed(step)
            sampler = Sampler(use_triton=use_triton)
            outputs.append(sampler.verify(logits, rows, draft_ids.to(DEVICE), cu_tensor.to(DEVICE), batches[use_triton]))
        reference, kernel = outputs
        assert torch.equal(kernel.token_ids, reference.token_ids)
        assert torch.equal(kernel.num_emitted, reference.num_emitted)
        emitted.append(reference.num_emitted.cpu())
    for name in ("output_pos", "output_counts"):
        assert torch.equal(getattr(batches[False], name), getattr(batches[True], name))
    emitted_all = torch.stack(emitted)
    k_plus_1 = torch.tensor(counts).expand_as(emitted_all)
    assert ((emitted_all > 2) & (emitted_all < k_plus_1)).any()  # several drafts accepted, then one rejected
