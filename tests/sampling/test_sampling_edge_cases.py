"""Edge cases: tiny top_p, fully masked rows, extreme temperature and bias, real vocabulary and batch sizes."""

from __future__ import annotations

import pytest
import torch
from sampling_helpers import char_encode

from sampling.batch import SamplingBatch
from sampling.ops.masks import AllTokensMaskedError
from sampling.params import SamplingParams
from sampling.sampler import Sampler
from sampling.tokenized import tokenize_strings

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PATHS = pytest.mark.parametrize("use_triton", [False, True], ids=["torch", "triton"])


def make_batch(params: list[SamplingParams], vocab: int, **kwargs) -> SamplingBatch:
    batch = SamplingBatch(len(params), vocab, 32, DEVICE, **kwargs)
    for row, p in enumerate(params):
        batch.add_request(row, p, [0, 1], tokenize_strings(p, char_encode(vocab)))
    return batch


def step(params: list[SamplingParams], logits: torch.Tensor, use_triton: bool | None = None, **kwargs) -> torch.Tensor:
    batch = make_batch(params, logits.shape[-1], **kwargs)
    rows = torch.arange(len(params), device=DEVICE)
    return Sampler(use_triton=use_triton)(logits.to(DEVICE), rows, batch).sampled_token_ids.cpu()


def random_logits(rows: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


@PATHS
def test_tiny_top_p_keeps_the_top_token(use_triton: bool) -> None:
    logits = random_logits(256, 100)
    out = step([SamplingParams(top_p=1e-9, seed=i) for i in range(256)], logits, use_triton)
    assert torch.equal(out, logits.argmax(dim=-1))


@PATHS
def test_temperature_1e_minus_6_is_argmax(use_triton: bool) -> None:
    logits = random_logits(256, 100, seed=1)
    out = step([SamplingParams(temperature=1e-6, top_p=0.9) for _ in range(256)], logits, use_triton)
    assert torch.equal(out, logits.argmax(dim=-1))


@PATHS
def test_logit_bias_plus_and_minus_100(use_triton: bool) -> None:
    logits = random_logits(512, 64, seed=2)
    top = logits.argmax(dim=-1)
    params = [SamplingParams(logit_bias={7: 100.0}, seed=i) if i % 2 else SamplingParams(logit_bias={int(top[i]): -100.0}) for i in range(512)]
    out = step(params, logits, use_triton)
    assert (out[1::2] == 7).all()
    assert (out[0::2] != top[0::2]).all()


def test_every_token_masked_is_rejected_at_join() -> None:
    with pytest.raises(AllTokensMaskedError, match="allowed_token_ids"):
        make_batch([SamplingParams(allowed_token_ids=[2], min_tokens=1)], 16, eos_token_ids=(2,))


def test_every_token_masked_by_a_multi_token_bad_word_raises() -> None:
    vocab = 128
    params = SamplingParams(allowed_token_ids=[ord("y")], bad_words=["xy"], seed=0)
    batch = make_batch([params], vocab)
    rows = torch.tensor([0], device=DEVICE)
    batch.record(rows, torch.tensor([ord("x")], device=DEVICE))  # the last output is "x": "y" now banned
    with pytest.raises(AllTokensMaskedError):
        Sampler()(torch.zeros(1, vocab, device=DEVICE), rows, batch)


@pytest.mark.parametrize("vocab", [49152, 128256, 151936])
def test_real_vocabulary_sizes(vocab: int) -> None:
    logits = random_logits(6, vocab, seed=3)
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(top_k=1, seed=1),
        SamplingParams(top_p=0.9, top_k=40, seed=2),
        SamplingParams(min_p=0.1, temperature=0.7),
        SamplingParams(temperature=1.0, repetition_penalty=1.2),
        SamplingParams(typical_p=0.9, top_n_sigma=1.5, xtc_probability=0.5),
    ]
    out = step(params, logits)
    argmax = logits.argmax(dim=-1)
    assert out[0] == argmax[0] and out[1] == argmax[1]
    assert ((out >= 0) & (out < vocab)).all()


def test_largest_vocabulary_on_the_kernel() -> None:
    vocab = 151936
    logits = random_logits(2, vocab, seed=4)
    params = [SamplingParams(top_k=40, top_p=0.9, seed=5), SamplingParams(min_p=0.2, seed=6)]
    assert torch.equal(step(params, logits, use_triton=True), step(params, logits, use_triton=False))


@pytest.mark.parametrize("batch_size", [1, 512])
def test_batch_sizes(batch_size: int) -> None:
    vocab = 2048
    logits = random_logits(batch_size, vocab, seed=5)
    params = [SamplingParams(temperature=0.0) if i % 3 == 0 else SamplingParams(top_p=0.9, seed=i) for i in range(batch_size)]
    out = step(params, logits)
    greedy = torch.arange(batch_size) % 3 == 0
    assert torch.equal(out[greedy], logits.argmax(dim=-1)[greedy])
    assert out.shape == (batch_size,)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("params", [SamplingParams(logit_bias={3: 50.0}, top_p=0.5), SamplingParams(repetition_penalty=1.5)])
def test_caller_logits_are_not_modified(dtype: torch.dtype, params: SamplingParams) -> None:
    logits = random_logits(4, 32).to(dtype)
    before = logits.clone()
    step([params] * 4, logits)
    assert torch.equal(logits, before)


def test_temperatures_under_vllms_epsilon_are_greedy() -> None:
    assert SamplingParams(temperature=9.9e-6).is_greedy and SamplingParams(temperature=5e-324).is_greedy
    assert not SamplingParams(temperature=1e-5).is_greedy
    logits = random_logits(64, 100, seed=4) + 100.0
    out = step([SamplingParams(temperature=1e-30, logit_bias={3: 100.0}, seed=i) for i in range(64)], logits)
    assert (out == 3).all()


SEEN = [0, 1]  # `make_batch`'s prompt: both tokens count as seen for the repetition penalty


@PATHS
@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "random"])
def test_a_row_the_penalties_leave_no_finite_logit_emits_minus_one(use_triton: bool, greedy: bool) -> None:
    """Only the seen tokens are allowed and an infinite repetition penalty (1e39 is inf in float32) sends them to -inf,
    or a zero one (1e-46 is 0 in float32) sends them to +inf: that row emits -1; the others sample as before."""
    logits = random_logits(3, 16, seed=5)
    logits[0, SEEN] = torch.tensor([-1.0, -2.0])
    logits[1, SEEN] = torch.tensor([1.0, 2.0])
    temperature = 0.0 if greedy else 1.0
    params = [
        SamplingParams(temperature=temperature, allowed_token_ids=SEEN, repetition_penalty=1e39, seed=1),
        SamplingParams(temperature=temperature, repetition_penalty=1e-46, seed=2),
        SamplingParams(temperature=0.0),
    ]
    out = step(params, logits, use_triton)
    assert out.tolist()[:2] == [-1, -1]
    assert out[2] == logits[2].argmax()


@PATHS
def test_a_nan_from_a_penalty_never_wins(use_triton: bool) -> None:
    """An infinite repetition penalty makes a seen logit of exactly 0 NaN (0 * inf): it counts as -inf."""
    logits = random_logits(64, 16, seed=6)
    logits[:, SEEN] = torch.tensor([0.0, -1.0])
    params = [SamplingParams(temperature=0.0 if i % 2 else 1.0, repetition_penalty=1e39, seed=i) for i in range(64)]
    out = step(params, logits, use_triton)
    assert ((out >= 2) & (out < 16)).all()
    assert torch.equal(out[1::2], logits[1::2, 2:].argmax(dim=-1) + 2)


def test_an_argmax_only_batch_records_its_tokens_in_one_operation() -> None:
    """What each launch costs on a GPU (a few microseconds; the greedy goal is 30 us a call, the row
    maximum included): an all-greedy batch's record is one index_add, counted as the torch operators that run."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Operators(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    batch = make_batch([SamplingParams(temperature=0.0)] * 4, 1000)
    token_ids, rows = torch.tensor([3, 1, 4, 1], device=DEVICE), torch.arange(4, device=DEVICE)
    with Operators() as operators:
        Sampler().record_argmax(token_ids, rows, batch)
    assert [name for name in operators.names if name.split(".")[0] != "slice"] == ["index_add_.default"], operators.names
    assert batch.output_pos[:4].tolist() == [1] * 4


@pytest.mark.parametrize("vocab", [1000, 49152])
def test_an_argmax_only_batch_takes_the_first_maximum_and_counts_it(vocab: int) -> None:
    """All greedy with nothing else to apply: `Sampler.__call__` takes the argmax alone, and must give what the
    pipeline gives a greedy batch that also reports logprobs (ties at the maximum included), and record the tokens."""
    logits = random_logits(6, vocab)
    logits[1, [7, vocab // 2, vocab - 1]] = 100.0  # a tie: the first wins
    logits[4] = 0.0  # every token ties
    rows = torch.arange(6, device=DEVICE)
    plain, with_logprobs = make_batch([SamplingParams(temperature=0.0)] * 6, vocab), make_batch([SamplingParams(temperature=0.0, logprobs=1)] * 6, vocab)
    assert plain.argmax_only and not with_logprobs.argmax_only
    fast = Sampler()(logits.to(DEVICE), rows, plain)
    full = Sampler()(logits.to(DEVICE), rows, with_logprobs)
    assert fast.logprobs is None and torch.equal(fast.sampled_token_ids, full.sampled_token_ids)
    assert fast.sampled_token_ids[1] == 7 and fast.sampled_token_ids[4] == 0
    assert torch.equal(plain.output_pos, with_logprobs.output_pos) and plain.output_pos.tolist() == [1] * 6
