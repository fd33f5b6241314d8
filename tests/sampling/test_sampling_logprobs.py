"""Logprobs: raw and processed, top-N, sampled token logprob and rank; prompt logprobs."""

from __future__ import annotations

import numpy as np
import torch

from sampling.batch import SamplingBatch
from sampling.logprobs import compute_prompt_logprobs
from sampling.params import SamplingParams
from sampling.sampler import Sampler

VOCAB = 50


def run(params: list[SamplingParams], logits: torch.Tensor, mode: str = "raw"):
    batch = SamplingBatch(len(params), VOCAB, 16, "cpu")
    for row, p in enumerate(params):
        batch.add_request(row, p, [0])
    return Sampler(logprobs_mode=mode)(logits, torch.arange(len(params)), batch)


def test_no_logprobs_when_nobody_asks() -> None:
    assert run([SamplingParams()], torch.randn(1, VOCAB)).logprobs is None


def test_raw_logprobs_top_n_and_rank() -> None:
    logits = torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(0)) * 2
    params = [SamplingParams(logprobs=5, seed=i, top_k=20) for i in range(5)] + [SamplingParams(logprobs=2, temperature=0.0)]
    out = run(params, logits)
    lp = out.logprobs
    assert lp is not None and lp.top_ids.shape == (6, 5)
    ref = torch.log_softmax(logits.double(), dim=-1).numpy()
    for r in range(6):
        order = np.argsort(-ref[r])
        assert lp.top_ids[r].tolist() == order[:5].tolist()
        np.testing.assert_allclose(lp.top_logprobs[r].numpy(), ref[r][order[:5]], rtol=1e-5, atol=1e-5)
        token = int(out.sampled_token_ids[r])
        np.testing.assert_allclose(float(lp.token_logprobs[r]), ref[r][token], rtol=1e-5, atol=1e-5)
        assert int(lp.token_ranks[r]) == 1 + int((ref[r] > ref[r][token]).sum())
    assert lp.token_ranks[5] == 1  # the greedy row took the argmax


def test_processed_logprobs_are_of_the_sampled_distribution() -> None:
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(1)) * 2
    params = [
        SamplingParams(logprobs=3, top_k=1),
        SamplingParams(logprobs=3, top_k=3, temperature=0.5),
        SamplingParams(logprobs=3, temperature=0.0, logit_bias={7: 100.0}),
    ]
    lp = run(params, logits, mode="processed").logprobs
    assert lp is not None
    assert lp.token_logprobs[0] == 0.0 and torch.isinf(lp.top_logprobs[0, 1:]).all()
    top3 = logits[1].topk(3).values / 0.5
    np.testing.assert_allclose(lp.top_logprobs[1].numpy(), torch.log_softmax(top3, dim=-1).numpy(), rtol=1e-5, atol=1e-5)
    assert lp.top_ids[2, 0] == 7  # processed includes the bias


def test_prompt_logprobs() -> None:
    logits = torch.randn(7, VOCAB, generator=torch.Generator().manual_seed(2))
    next_ids = torch.randint(0, VOCAB, (7,), generator=torch.Generator().manual_seed(3))
    lp = compute_prompt_logprobs(logits.to(torch.bfloat16), next_ids, 4)
    ref = torch.log_softmax(logits.to(torch.bfloat16).float(), dim=-1)
    torch.testing.assert_close(lp.token_logprobs, ref.gather(1, next_ids[:, None]).squeeze(1))
    assert lp.top_ids.shape == (7, 4)
    assert torch.equal(lp.token_ranks, (ref > lp.token_logprobs[:, None]).sum(-1) + 1)
