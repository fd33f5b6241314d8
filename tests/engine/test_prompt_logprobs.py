"""Prompt logprobs: log_softmax of transformers' logits on the same GGUF, however the prompt is
chunked, scheduled (synchronous or not) or found in the prefix cache."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.kv.kv_cache import bytes_per_block
from engine.models.attention_metadata import ScheduledChunk
from engine.outputs import FinishReason, PromptLogprobs
from engine.prompt_logprobs import PromptLogprobsRequests
from engine.request import Request
from engine.scheduler import ScheduledStep
from sampling.params import SamplingParams
from tests.engine.conftest import output_ids, run_until_done

transformers = pytest.importorskip("transformers")

TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
    "movable metal type, oil-based ink and a wooden screw press. Within fifty years printers worked in more "
    "than two hundred cities across Europe, and the price of books fell so far that reading spread well "
    "beyond monasteries and universities."
)
NUM_TOP = 5
CHUNK = 24
"""max_num_batched_tokens of the chunked engines: the prompt (about 70 tokens) takes several steps."""
# Logits agree with transformers within 3e-5 (tests/engine/test_reference_logits.py); a logprob
# is a logit minus a logsumexp, so it moves by at most twice that. A wrong row (an off-by-one
# between chunks) moves it by whole nats.
LOGPROB_ATOL = 1e-3
SAME_RUN_ATOL = 1e-4
"""Chunked against unchunked: only the attention's reduction order differs."""


@pytest.fixture(scope="module")
def prompt(smollm_checkpoint) -> list[int]:
    ids = smollm_checkpoint.tokenizer.encode(TEXT)
    assert len(ids) > 2 * CHUNK
    return ids


@pytest.fixture(scope="module")
def reference_logprobs(prompt, transformers_model) -> torch.Tensor:
    """[P - 1, V]: transformers' log_softmax at every prompt position but the last."""
    with torch.no_grad():
        logits = transformers_model(torch.tensor([prompt])).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1)


def engine_for(checkpoint, max_num_batched_tokens: int, **config: object) -> EngineCore:
    """float32 for every token (no bfloat16 prompt tiles): the scores are held to transformers' float32 ones."""
    config = {"bf16_prompt_matmuls": False} | config
    return EngineCore(EngineConfig(max_num_seqs=4, max_model_len=256, max_num_batched_tokens=max_num_batched_tokens, dtype="float32", **config), checkpoint)


def scored(engine: EngineCore, prompt: list[int], params: SamplingParams, request_id: str = "r") -> PromptLogprobs:
    engine.add_request(request_id, prompt, params)
    outputs = run_until_done(engine)[request_id]
    assert outputs[0].prompt_logprobs is not None
    assert all(output.prompt_logprobs is None for output in outputs[1:])
    return outputs[0].prompt_logprobs


SCORE = SamplingParams(prompt_logprobs=NUM_TOP, max_tokens=0)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_chunked_prompt_logprobs_equal_log_softmax_of_transformers_logits(smollm_checkpoint, prompt, reference_logprobs, async_scheduling):
    engine = engine_for(smollm_checkpoint, CHUNK, async_scheduling=async_scheduling)
    result = scored(engine, prompt, SCORE)
    assert result.token_ids == prompt
    assert len(result.entries) == len(prompt) - 1
    targets = torch.tensor(prompt[1:])
    expected = reference_logprobs.gather(1, targets[:, None]).squeeze(1)
    ours = torch.tensor([entry.logprob for entry in result.entries])
    torch.testing.assert_close(ours, expected, atol=LOGPROB_ATOL, rtol=0)
    top_expected = reference_logprobs.topk(NUM_TOP, dim=-1).values
    torch.testing.assert_close(torch.tensor([entry.top_logprobs for entry in result.entries]), top_expected, atol=LOGPROB_ATOL, rtol=0)
    for position, entry in enumerate(result.entries):
        row = reference_logprobs[position]
        assert set(entry.top_token_ids) <= set(torch.nonzero(row >= top_expected[position, -1] - LOGPROB_ATOL).flatten().tolist())
        clear = (row > expected[position] + LOGPROB_ATOL).sum().item() + 1  # rank with margins to spare
        assert clear <= entry.rank <= (row > expected[position] - LOGPROB_ATOL).sum().item() + 1


def test_chunked_equals_unchunked_and_the_generated_tokens_are_unchanged(smollm_checkpoint, prompt):
    params = SamplingParams(prompt_logprobs=NUM_TOP, temperature=0.0, max_tokens=6, ignore_eos=True)
    whole = engine_for(smollm_checkpoint, 512)
    chunked = engine_for(smollm_checkpoint, CHUNK)
    whole.add_request("r", prompt, params)
    chunked.add_request("r", prompt, params)
    whole_outputs, chunked_outputs = run_until_done(whole)["r"], run_until_done(chunked)["r"]
    assert output_ids(whole_outputs) == output_ids(chunked_outputs)
    a, b = whole_outputs[0].prompt_logprobs, chunked_outputs[0].prompt_logprobs
    assert a is not None and b is not None
    assert [e.top_token_ids for e in a.entries] == [e.top_token_ids for e in b.entries]
    assert [e.rank for e in a.entries] == [e.rank for e in b.entries]
    torch.testing.assert_close(torch.tensor([e.logprob for e in a.entries]), torch.tensor([e.logprob for e in b.entries]), atol=SAME_RUN_ATOL, rtol=0)
    plain = engine_for(smollm_checkpoint, CHUNK)
    plain.add_request("r", prompt, params.model_copy(update={"prompt_logprobs": None}))
    assert output_ids(run_until_done(plain)["r"]) == output_ids(chunked_outputs)


def test_a_warm_prefix_cache_is_not_used_by_a_request_scoring_its_prompt(smollm_checkpoint, prompt):
    cold = scored(engine_for(smollm_checkpoint, CHUNK), prompt, SCORE)
    engine = engine_for(smollm_checkpoint, CHUNK)
    engine.add_request("warm-up", prompt, SamplingParams(max_tokens=1))
    run_until_done(engine)
    hits = engine.prefix_cache_stats.hit_tokens
    warm = scored(engine, prompt, SCORE)
    assert engine.prefix_cache_stats.hit_tokens == hits  # its prompt was computed again, logits and all
    assert [e.top_token_ids for e in warm.entries] == [e.top_token_ids for e in cold.entries]
    torch.testing.assert_close(torch.tensor([e.logprob for e in warm.entries]), torch.tensor([e.logprob for e in cold.entries]), atol=SAME_RUN_ATOL, rtol=0)
    engine.add_request("plain", prompt, SamplingParams(max_tokens=1))
    run_until_done(engine)
    assert engine.prefix_cache_stats.hit_tokens > hits  # others still hit the blocks the scoring request cached


def test_max_tokens_zero_scores_the_prompt_and_generates_nothing(smollm_checkpoint, prompt):
    engine = engine_for(smollm_checkpoint, CHUNK)
    engine.add_request("r", prompt, SamplingParams(prompt_logprobs=0, max_tokens=0, logprobs=3))
    [output] = run_until_done(engine)["r"]
    assert output.new_token_ids == [] and output.finish_reason is FinishReason.LENGTH
    assert output.prompt_logprobs is not None and all(e.top_token_ids == [] for e in output.prompt_logprobs.entries)
    assert not output.logprobs
    assert engine.num_generated("r") == 0


def test_only_rows_of_requests_that_asked_go_through_the_lm_head():
    asking = Request("a", [1, 2, 3, 4, 5, 6], SamplingParams(prompt_logprobs=2))
    other = Request("b", [7, 8, 9], SamplingParams())
    scoring = PromptLogprobsRequests()
    scoring.add(asking)
    step = ScheduledStep(requests=[other, asking], chunks=[ScheduledChunk((0,), 0, 3), ScheduledChunk((1,), 0, 4)])
    plan = scoring.plan(step)
    assert plan is not None
    assert plan.rows == [3, 4, 5, 6] and plan.next_token_ids == [2, 3, 4, 5] and plan.requests == [asking]
    asking.num_computed_tokens = 4
    second = scoring.plan(ScheduledStep(requests=[asking], chunks=[ScheduledChunk((1,), 4, 2)]))
    assert second is not None and second.rows == [0] and second.next_token_ids == [6]  # the last prompt position scores nothing
    assert scoring.plan(ScheduledStep(requests=[asking], chunks=[ScheduledChunk((1,), 0, 6)])) is None  # recomputed after preemption


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_preempted_requests_score_each_prompt_token_once(tiny_checkpoint, async_scheduling):
    # 6 blocks of 16 positions for 4 prompts of 40 to 70 tokens prefilled 16 tokens a step: requests are
    # preempted mid-prefill and recompute positions they already scored.
    prompts = {f"r{i}": [(i * 97 + j * 31) % 4000 + 5 for j in range(40 + 10 * i)] for i in range(4)}
    params = SamplingParams(prompt_logprobs=2, temperature=0.0, max_tokens=4, ignore_eos=True)

    def run(**overrides: object) -> tuple[EngineCore, dict[str, PromptLogprobs]]:
        config = EngineConfig(
            model="tiny-random", dtype="float32", max_num_seqs=4, max_model_len=128, max_num_batched_tokens=16, async_scheduling=async_scheduling, **overrides
        )
        engine = EngineCore(config, tiny_checkpoint)
        for request_id, prompt in prompts.items():
            engine.add_request(request_id, prompt, params)
        outputs = run_until_done(engine)
        return engine, {request_id: outputs[request_id][0].prompt_logprobs for request_id in prompts}

    block_bytes = bytes_per_block(tiny_checkpoint.config, 16, tiny_checkpoint.weights["embed_tokens.weight"].dtype)
    tight, preempted = run(kv_cache_memory=6 * block_bytes)
    _, roomy = run()
    assert tight.scheduler.num_preemptions > 0
    for request_id, prompt in prompts.items():
        assert len(preempted[request_id].entries) == len(prompt) - 1
        assert [e.top_token_ids for e in preempted[request_id].entries] == [e.top_token_ids for e in roomy[request_id].entries]
        got, expected = ([e.logprob for e in result[request_id].entries] for result in (preempted, roomy))
        torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), atol=SAME_RUN_ATOL, rtol=0)
