"""EngineCore: validation, engine-side stops, aborts, slots and FIFO admission (tiny random model)."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from engine.config import BATCHED_TOKENS_BY_DEVICE, EngineConfig
from engine.core import EngineCore, InvalidRequestError
from engine.loader.checkpoint import Checkpoint
from engine.outputs import FinishReason
from engine.request import Request, check_stop
from sampling.params import SamplingParams
from sampling.tokenized import tokenize_strings
from tests.engine.conftest import output_ids, run_until_done

PROMPT = list(range(300, 310))
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def make_engine(checkpoint: Checkpoint, **overrides) -> EngineCore:
    """Synchronous steps (what these tests pin, step by step) also on CUDA, where async scheduling is the default;
    `test_async_scheduling_gives_the_same_outputs` checks the async engine against them."""
    config = EngineConfig(model="tiny-random", **{"max_num_seqs": 4, "max_model_len": 64, "async_scheduling": False, **overrides})
    return EngineCore(config, checkpoint)


@pytest.fixture(scope="module")
def reference_tokens(tiny_checkpoint) -> list[int]:
    """The greedy continuation of PROMPT: 12 tokens."""
    engine = make_engine(tiny_checkpoint)
    engine.add_request("ref", PROMPT, GREEDY)
    return output_ids(run_until_done(engine)["ref"])


def first_new_token(tokens: list[int]) -> tuple[int, int]:
    """A token of ``tokens`` (and its index) that does not occur earlier in it, past index 2."""
    for index in range(3, len(tokens)):
        if tokens[index] not in tokens[:index]:
            return index, tokens[index]
    raise AssertionError("no suitable token")


@pytest.mark.parametrize(
    ("prompt", "params", "message"),
    [
        ([], GREEDY, "empty"),
        (list(range(64)), GREEDY, "64 tokens"),
        ([5, 49152], GREEDY, "outside the vocabulary"),
        ([5, -1], GREEDY, "outside the vocabulary"),
        (PROMPT, SamplingParams(stop_token_ids=[60000]), "stop_token_ids"),
        (PROMPT, SamplingParams(logit_bias={99999: 1.0}), "logit_bias"),
        (PROMPT, SamplingParams(allowed_token_ids=[7], stop_token_ids=[7], min_tokens=2), "allowed_token_ids"),
        (PROMPT, SamplingParams(allowed_token_ids=[7, 8], bad_words=["hello world"]), "bad_words"),
    ],
)
def test_invalid_requests_are_rejected_without_disturbing_others(tiny_checkpoint, reference_tokens, prompt, params, message):
    engine = make_engine(tiny_checkpoint)
    engine.add_request("good", PROMPT, GREEDY)
    engine.step()
    with pytest.raises(InvalidRequestError, match=message):
        engine.add_request("bad", prompt, params, tokenize_strings(params, engine.tokenizer.encode))
    assert output_ids(run_until_done(engine)["good"])[-11:] == reference_tokens[1:]


def test_duplicate_request_id_is_rejected(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    engine.add_request("a", PROMPT, GREEDY)
    with pytest.raises(InvalidRequestError, match="already in use"):
        engine.add_request("a", PROMPT, GREEDY)
    assert engine.num_waiting == 1


def test_max_tokens_finishes_with_length(tiny_checkpoint, reference_tokens):
    engine = make_engine(tiny_checkpoint)
    engine.add_request("a", PROMPT, GREEDY.model_copy(update={"max_tokens": 5}))
    outputs = run_until_done(engine)["a"]
    assert output_ids(outputs) == reference_tokens[:5]
    assert outputs[-1].finish_reason == FinishReason.LENGTH
    assert all(o.finish_reason is None for o in outputs[:-1])
    assert outputs[-1].num_prompt_tokens == len(PROMPT)


def test_stop_token_id_finishes_with_stop_reason(tiny_checkpoint, reference_tokens):
    index, token = first_new_token(reference_tokens)
    engine = make_engine(tiny_checkpoint)
    engine.add_request("a", PROMPT, GREEDY.model_copy(update={"stop_token_ids": [token]}))
    outputs = run_until_done(engine)["a"]
    assert output_ids(outputs) == reference_tokens[: index + 1]
    assert (outputs[-1].finish_reason, outputs[-1].stop_reason) == (FinishReason.STOP, token)


@pytest.fixture(scope="module")
def eos_engine_and_index(tiny_checkpoint, reference_tokens) -> tuple[EngineCore, int]:
    """An engine whose EOS is a token the greedy continuation produces at ``index``."""
    index, token = first_new_token(reference_tokens)
    tokenizer = dataclasses.replace(tiny_checkpoint.tokenizer, eos_token_ids=(token,))
    return make_engine(dataclasses.replace(tiny_checkpoint, tokenizer=tokenizer)), index


def test_eos_stops_unless_ignored(eos_engine_and_index, reference_tokens):
    engine, index = eos_engine_and_index
    engine.add_request("eos", PROMPT, GREEDY.model_copy(update={"ignore_eos": False}))
    engine.add_request("ignored", PROMPT, GREEDY)
    outputs = run_until_done(engine)
    assert output_ids(outputs["eos"]) == reference_tokens[: index + 1]
    assert (outputs["eos"][-1].finish_reason, outputs["eos"][-1].stop_reason) == (FinishReason.STOP, None)
    assert output_ids(outputs["ignored"]) == reference_tokens


def test_min_tokens_gates_eos(eos_engine_and_index, reference_tokens):
    engine, index = eos_engine_and_index
    params = GREEDY.model_copy(update={"ignore_eos": False, "min_tokens": index + 2})
    engine.add_request("gated", PROMPT, params)
    outputs = run_until_done(engine)["gated"]
    assert len(output_ids(outputs)) > index + 1


def test_context_length_finishes_with_length(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint, max_model_len=16)
    engine.add_request("a", PROMPT, GREEDY.model_copy(update={"max_tokens": None}))
    outputs = run_until_done(engine)["a"]
    assert len(output_ids(outputs)) == 16 - len(PROMPT)
    assert outputs[-1].finish_reason == FinishReason.LENGTH


def test_abort_frees_the_slot_before_the_next_step(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint, max_num_seqs=1)
    engine.add_request("a", PROMPT, GREEDY)
    engine.add_request("b", PROMPT, GREEDY)
    engine.step()
    assert (engine.num_running, engine.num_waiting) == (1, 1)
    engine.abort_requests(["a", "unknown"])
    assert (engine.num_running, engine.num_waiting) == (0, 1)
    outputs = engine.step()
    assert [(o.request_id, o.finish_reason) for o in outputs] == [("a", FinishReason.ABORT), ("b", None)]
    assert engine.num_running == 1
    assert engine.num_generated("a") == 1


def test_abort_of_a_waiting_request(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint, max_num_seqs=1)
    engine.add_request("a", PROMPT, GREEDY)
    engine.add_request("b", PROMPT, GREEDY)
    engine.abort_requests(["b"])
    outputs = run_until_done(engine)
    assert outputs["b"][-1].finish_reason == FinishReason.ABORT
    assert output_ids(outputs["b"]) == []


def test_finished_request_frees_its_slot_for_the_next_step(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint, max_num_seqs=1)
    once = GREEDY.model_copy(update={"max_tokens": 1})
    engine.add_request("a", PROMPT, once)
    engine.add_request("b", PROMPT, once)
    assert [o.request_id for o in engine.step()] == ["a"]
    assert [o.request_id for o in engine.step()] == ["b"]


def test_waiting_requests_are_admitted_fifo(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint, max_num_seqs=2)
    for name in "abcde":
        engine.add_request(name, PROMPT, GREEDY.model_copy(update={"max_tokens": 2}))
    finished = [o.request_id for step in range(20) for o in engine.step() if o.finish_reason]
    assert finished == list("abcde")


def test_a_request_mid_prefill_samples_nothing(tiny_checkpoint, reference_tokens):
    engine = make_engine(tiny_checkpoint, max_num_batched_tokens=4)
    engine.add_request("a", PROMPT, GREEDY)
    assert engine.step() == [] and engine.step() == []
    (output,) = engine.step()
    assert output.new_token_ids == reference_tokens[:1]


def test_counters(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    engine.add_request("a", PROMPT, GREEDY.model_copy(update={"max_tokens": 3}))
    engine.add_request("b", PROMPT, GREEDY.model_copy(update={"max_tokens": 5}))
    run_until_done(engine)
    assert (engine.num_generated("a"), engine.num_generated("b"), engine.num_generated_tokens) == (3, 5, 8)
    assert (engine.num_running, engine.num_waiting, engine.has_unfinished_requests()) == (0, 0, False)


@pytest.mark.parametrize("max_model_len", [64, 16])
def test_async_scheduling_gives_the_same_outputs(tiny_checkpoint, eos_engine_and_index, max_model_len):
    """Stops by max_tokens, stop token, EOS, min_tokens and context length, and an abort
    mid-flight, give the same tokens and finish reasons with async scheduling."""
    eos_checkpoint = dataclasses.replace(tiny_checkpoint, tokenizer=eos_engine_and_index[0].tokenizer)
    requests = {
        "max_tokens": GREEDY.model_copy(update={"max_tokens": 7}),
        "eos": GREEDY.model_copy(update={"ignore_eos": False}),
        "min_tokens": GREEDY.model_copy(update={"ignore_eos": False, "min_tokens": 9}),
        "context": GREEDY.model_copy(update={"max_tokens": None}),
        "seeded": SamplingParams(temperature=1.0, seed=3, max_tokens=10),
        "aborted": GREEDY,
    }

    def run(async_scheduling: bool) -> dict[str, tuple[list[int], FinishReason | None]]:
        engine = make_engine(eos_checkpoint, max_model_len=max_model_len, async_scheduling=async_scheduling)
        for name, params in requests.items():
            engine.add_request(name, PROMPT, params)
        outputs: dict[str, list] = {}
        for step in range(200):
            if step == 6:
                engine.abort_requests(["aborted"])
            for output in engine.step():
                outputs.setdefault(output.request_id, []).append(output)
            if not engine.has_unfinished_requests():
                break
        return {name: (output_ids(outs), outs[-1].finish_reason) for name, outs in outputs.items()}

    sync, overlapped = run(False), run(True)
    assert {k: v for k, v in overlapped.items() if k != "aborted"} == {k: v for k, v in sync.items() if k != "aborted"}
    assert overlapped["aborted"][1] == FinishReason.ABORT
    assert overlapped["aborted"][0] == sync["context"][0][: len(overlapped["aborted"][0])]


def test_stop_token_ids_are_a_set_built_once():
    """``check_stop`` runs per token: membership in a request's stop ids must not scan the list."""
    params = SamplingParams(stop_token_ids=list(range(100_000, 0, -1)), max_tokens=None)
    request = Request("r", PROMPT, params, output_token_ids=[7])
    assert isinstance(request.stop_token_ids, frozenset) and len(request.stop_token_ids) == 100_000
    assert check_stop(request, (2,), max_model_len=64) == (FinishReason.STOP, 7)
    request.output_token_ids.append(100_001)
    assert check_stop(request, (2,), max_model_len=64) is None


def test_the_engine_never_tokenizes(tiny_checkpoint, monkeypatch):
    """Bad words, DRY breakers and the negative prompt arrive as ids; without them such a request is refused."""
    engine = make_engine(tiny_checkpoint)
    params = SamplingParams(bad_words=["foo bar"], dry_multiplier=0.5, guidance_scale=2.0, negative_prompt="no", max_tokens=4, seed=1)
    strings = tokenize_strings(params, engine.tokenizer.encode)

    def refuse(*args: object, **kwargs: object) -> list[int]:
        raise AssertionError("the engine tokenized")

    monkeypatch.setattr(engine.tokenizer, "encode", refuse)
    with pytest.raises(InvalidRequestError, match="TokenizedStrings"):
        engine.add_request("untokenized", PROMPT, params)
    engine.add_request("a", PROMPT, params, strings)
    assert run_until_done(engine)["a"][-1].finish_reason == FinishReason.LENGTH


def test_a_cpu_engine_computes_on_every_core_unless_told(tiny_checkpoint):
    """A Ray actor starts with OMP_NUM_THREADS equal to its reserved CPUs (one for the engine): the engine sets its own."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        make_engine(tiny_checkpoint, device="cpu")
        assert torch.get_num_threads() == len(os.sched_getaffinity(0))
        make_engine(tiny_checkpoint, device="cpu", cpu_threads=1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))])
def test_the_step_token_budget_defaults_by_device_and_an_explicit_one_wins(tiny_checkpoint, device):
    default = EngineCore(EngineConfig(model="tiny-random", device=device, max_model_len=64, max_num_seqs=2), tiny_checkpoint)
    assert default.scheduler.max_num_batched_tokens == BATCHED_TOKENS_BY_DEVICE[device]
    chosen = EngineCore(EngineConfig(model="tiny-random", device=device, max_model_len=64, max_num_seqs=2, max_num_batched_tokens=48), tiny_checkpoint)
    assert chosen.scheduler.max_num_batched_tokens == 48
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        EngineConfig(max_num_batched_tokens=0)
