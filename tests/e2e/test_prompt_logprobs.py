"""Prompt logprobs through the `openai` client: `echo` + `logprobs` (with `max_tokens: 0`) and vLLM's
`prompt_logprobs` on both endpoints, equal to the engine's own values for the same prompt."""

from __future__ import annotations

import math

import openai
import pytest

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.loader.checkpoint import load_checkpoint
from engine.outputs import PromptLogprobs
from sampling.params import SamplingParams
from tests.engine.conftest import run_until_done

TEXT = (
    "Perplexity measures how well a language model predicts a sample of text. A lower value means the model "
    "finds the text less surprising. Evaluation harnesses compute it from the logprob of every token, which "
    "the server returns when the request echoes its prompt with logprobs and asks for no new tokens at all. "
)
NUM_TOP = 3
# The server's batches and chunks differ from the engine's below; only reduction order differs
# (tests/engine/test_prompt_logprobs.py measures chunked against unchunked within 1e-4).
ATOL = 1e-4


@pytest.fixture(scope="module")
def engine_scores(server) -> tuple[list[int], PromptLogprobs]:
    """A prompt of over 512 tokens (so the server prefills it in chunks) and the in-process engine's prompt logprobs."""
    checkpoint = load_checkpoint(server.model)
    ids = checkpoint.tokenizer.encode(TEXT * 8)[:600]
    engine = EngineCore(EngineConfig(max_num_seqs=1, max_model_len=1024, dtype="float32"), checkpoint)
    engine.add_request("r", ids, SamplingParams(prompt_logprobs=NUM_TOP, max_tokens=0))
    scores = run_until_done(engine)["r"][0].prompt_logprobs
    assert scores is not None and len(scores.entries) == len(ids) - 1
    return ids, scores


def test_echo_with_logprobs_and_max_tokens_zero_scores_the_prompt(server, engine_scores):
    ids, scores = engine_scores
    client = server.openai()
    full = client.completions.create(model=server.model, prompt=ids, max_tokens=0, echo=True, logprobs=NUM_TOP, temperature=0.0)
    choice = full.choices[0]
    assert choice.finish_reason == "length"
    assert full.usage.prompt_tokens == len(ids) and full.usage.completion_tokens == 0
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == len(ids)
    assert "".join(lp.tokens) == choice.text
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    for logprob, top, entry in zip(lp.token_logprobs[1:], lp.top_logprobs[1:], scores.entries):
        assert math.isclose(logprob, entry.logprob, abs_tol=ATOL)
        assert len(top) <= NUM_TOP  # strings of distinct ids may coincide
        assert math.isclose(max(top.values()), entry.top_logprobs[0], abs_tol=ATOL)


def test_echo_with_logprobs_streamed_equals_the_whole_response(server):
    client = server.openai()
    request = {"model": server.model, "prompt": "The capital of France is", "max_tokens": 4, "echo": True, "logprobs": 2, "temperature": 0.0}
    full = client.completions.create(**request)
    chunks = list(client.completions.create(**request, stream=True))
    assert "".join(c.text for chunk in chunks for c in chunk.choices) == full.choices[0].text
    tokens = [t for chunk in chunks for c in chunk.choices if c.logprobs for t in c.logprobs.tokens]
    logprobs = [lp for chunk in chunks for c in chunk.choices if c.logprobs for lp in c.logprobs.token_logprobs]
    assert tokens == full.choices[0].logprobs.tokens
    assert logprobs[0] is None and logprobs[1:] == pytest.approx(full.choices[0].logprobs.token_logprobs[1:], abs=ATOL)
    assert len(tokens) == full.usage.prompt_tokens + full.usage.completion_tokens


def check_vllm_prompt_logprobs(field: list, ids: list[int], scores: PromptLogprobs) -> None:
    assert len(field) == len(ids) and field[0] is None
    for token_id, ranked, entry in zip(ids[1:], field[1:], scores.entries):
        actual = ranked[str(token_id)]
        assert math.isclose(actual["logprob"], entry.logprob, abs_tol=ATOL)
        assert actual["rank"] == entry.rank and isinstance(actual["decoded_token"], str)
        assert {int(k) for k in ranked} == {token_id, *entry.top_token_ids}  # the actual token and the top N
        assert [ranked[str(t)]["logprob"] for t in entry.top_token_ids] == pytest.approx(entry.top_logprobs, abs=ATOL)


def test_prompt_logprobs_on_completions(server, engine_scores):
    ids, scores = engine_scores
    client = server.openai()
    full = client.completions.create(model=server.model, prompt=ids, max_tokens=2, temperature=0.0, extra_body={"prompt_logprobs": NUM_TOP})
    check_vllm_prompt_logprobs(full.choices[0].model_extra["prompt_logprobs"], ids, scores)
    assert full.usage.completion_tokens == 2


def test_prompt_logprobs_on_chat_equal_those_of_the_same_ids_on_completions(server):
    client = server.openai()
    messages = [{"role": "user", "content": "Name a colour."}]
    full = client.chat.completions.create(model=server.model, messages=messages, max_tokens=1, temperature=0.0, extra_body={"prompt_logprobs": 1})
    field = full.model_extra["prompt_logprobs"]
    assert len(field) == full.usage.prompt_tokens and field[0] is None
    # Each map starts with the actual token; the ChatML prompt starts with <|im_start|> (id 1).
    ids = [1] + [int(next(iter(ranked))) for ranked in field[1:]]
    plain = client.completions.create(model=server.model, prompt=ids, max_tokens=0, extra_body={"prompt_logprobs": 1})
    expected = plain.choices[0].model_extra["prompt_logprobs"]
    for ranked, same in zip(field[1:], expected[1:]):
        assert list(ranked) == list(same)
        assert [v["logprob"] for v in ranked.values()] == pytest.approx([v["logprob"] for v in same.values()], abs=ATOL)


def test_prompt_logprobs_are_refused_when_streamed_or_out_of_range(server):
    client = server.openai()
    for extra, stream in (({"prompt_logprobs": 2}, True), ({"prompt_logprobs": 21}, False)):
        with pytest.raises(openai.BadRequestError) as error:
            client.completions.create(model=server.model, prompt="Hello", max_tokens=1, stream=stream, extra_body=extra)
        assert error.value.body["param"] == "prompt_logprobs"
