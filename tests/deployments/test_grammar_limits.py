"""Grammar and synchronous-row limits at the ingress and the engine actor (no Ray): the options reach the
engine, a constraint or beam search past the operator's row limits is a 400 naming the field and the
setting, and a request past the compile budget is refused to its sender alone (429 for the client's share,
503 for the engine's), as OpenAI error JSON naming the limit."""

from __future__ import annotations

import asyncio
import threading

import pytest
from pydantic import ValidationError

from deployments.config import ServeArgs
from deployments.engine_actor import EngineActor, NewRequest, Refusal
from deployments.limits import RequestLimits, check_sampling
from deployments.openai.errors import APIError
from engine.config import EngineConfig
from engine.grammar.limits import CompileBudget, GrammarLimits
from sampling.params import SamplingParams


def test_grammar_options_reach_the_engine():
    args = ServeArgs(
        max_queued_grammar_compiles=6,
        max_client_grammar_compiles=2,
        grammar_compile_timeout_s=3.5,
        grammar_max_lexer_states=1000,
        grammar_step_lexer_fuel=5000,
        grammar_max_items_in_row=300,
        max_constrained_rows=7,
        max_beam_rows=9,
    )
    config = args.engine_config()
    assert config.compile_budget == CompileBudget(per_engine=6, per_client=2, timeout_s=3.5)
    assert config.grammar_limits == GrammarLimits(max_lexer_states=1000, step_lexer_fuel=5000, max_items_in_row=300)
    assert (config.max_constrained_rows, config.max_beam_rows) == (7, 9)
    with pytest.raises(ValidationError, match="max_client_grammar_compiles"):
        ServeArgs(max_queued_grammar_compiles=2, max_client_grammar_compiles=3)


@pytest.mark.parametrize("structured_param", ["response_format", "structured_outputs", "tool_choice"])
def test_constraints_turned_off_are_a_400_naming_the_field_and_the_setting(structured_param):
    params = SamplingParams(structured_outputs={"regex": "a+"})
    check_sampling(RequestLimits(max_constrained_rows=1), params, 1, server_speculative_tokens=0, structured_param=structured_param)
    with pytest.raises(APIError) as refused:
        check_sampling(RequestLimits(max_constrained_rows=0), params, 1, server_speculative_tokens=0, structured_param=structured_param)
    error = refused.value
    assert (error.status, error.param, error.code) == (400, structured_param, "limit_exceeded") and "max_constrained_rows" in error.message


@pytest.mark.parametrize("max_beam_rows", [0, 3])
def test_a_beam_search_wider_than_the_beam_rows_is_a_400_naming_the_setting(max_beam_rows):
    limits = RequestLimits(max_beam_rows=max_beam_rows)
    check_sampling(limits, SamplingParams(), 1, server_speculative_tokens=0)
    if max_beam_rows:
        check_sampling(limits, SamplingParams(use_beam_search=True, n=max_beam_rows), max_beam_rows, server_speculative_tokens=0)
    with pytest.raises(APIError) as refused:
        check_sampling(limits, SamplingParams(use_beam_search=True, n=max_beam_rows + 1), max_beam_rows + 1, server_speculative_tokens=0)
    assert (refused.value.status, refused.value.param) == (400, "n") and "max_beam_rows" in refused.value.message


def regex_request(request_id: str, regex: str, client: str) -> NewRequest:
    return NewRequest(request_id, [1, 2, 3], SamplingParams(max_tokens=2, structured_outputs={"regex": regex}), client=client)


def test_compiles_past_the_budget_are_refused_to_their_sender_alone():
    budget = CompileBudget(per_engine=3, per_client=2)

    async def run() -> None:
        actor = EngineActor(EngineConfig(model="tiny-random", max_num_seqs=4, max_model_len=64, compile_budget=budget), max_waiting_requests=8)
        release = threading.Event()
        compile_now = actor.engine.constrained.compiler._compile
        actor.engine.constrained.compiler._compile = lambda constraint: release.wait(30) and compile_now(constraint)
        try:
            await actor.ready()
            first = [regex_request(f"h{i}", f"h{i}", "hostile") for i in range(3)]
            errors = (await actor.add_requests("ingress", first)).errors
            assert errors[:2] == [None, None]
            assert isinstance(errors[2], Refusal) and (errors[2].status, errors[2].code) == (429, "grammar_compiles_busy")
            assert "max_client_grammar_compiles" in errors[2].message
            later = [regex_request("o1", "o1", "other"), regex_request("o2", "o2", "another"), regex_request("plain-ish", "h0", "third")]
            errors = (await actor.add_requests("ingress", later)).errors
            assert errors[0] is None and errors[2] is None  # the third joins h0's compile
            assert isinstance(errors[1], Refusal) and errors[1].status == 503 and "max_queued_grammar_compiles" in errors[1].message
            plain = NewRequest("plain", [1, 2, 3], SamplingParams(max_tokens=2))
            assert (await actor.add_requests("ingress", [plain])).errors == [None]
        finally:
            release.set()
            await actor.shutdown()

    asyncio.run(run())
