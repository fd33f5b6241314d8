"""What grammars may cost an engine (issue 23): the choices of a request share one compile, uncached
compiles are bounded per engine and per client, a compile past the deadline fails its requests alone,
llguidance's limits come from the engine's config, and constrained and beam rows wait behind their caps."""

from __future__ import annotations

import threading

import llguidance
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.core import EngineCore, InvalidRequestError
from engine.grammar.compiler import CompileLimit, CompilesBusyError
from engine.grammar.limits import CompileBudget, GrammarLimits
from engine.grammar.spec import grammar_error, parser_limits
from engine.outputs import EngineOutput, FinishReason
from sampling.params import SamplingParams
from sampling.structured_outputs import StructuredOutputs
from tests.engine.conftest import output_ids, run_until_done

PROMPT = [1, 2, 3, 4]


def tiny_engine(tiny_checkpoint, **overrides) -> EngineCore:
    settings = {"model": "tiny-random", "max_num_seqs": 8, "max_model_len": 128, "max_num_batched_tokens": 128} | overrides
    return EngineCore(EngineConfig(**settings), checkpoint=tiny_checkpoint)


def regex_params(regex: str, **fields) -> SamplingParams:
    return SamplingParams(**({"temperature": 0.0, "max_tokens": 8, "structured_outputs": {"regex": regex}} | fields))


def hold_compiles(engine: EngineCore) -> threading.Event:
    """Make the engine's compiles wait until the returned event is set (a slow grammar)."""
    release = threading.Event()
    compile_now = engine.constrained.compiler._compile

    def slow(constraint: StructuredOutputs) -> llguidance.LLMatcher:
        release.wait(30)
        return compile_now(constraint)

    engine.constrained.compiler._compile = slow  # type: ignore[method-assign]
    return release


def test_the_choices_of_a_request_share_one_compile(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint)
    release = hold_compiles(engine)
    for i in range(6):
        engine.add_request(f"r-{i}", PROMPT, regex_params("[0-9]{3}", seed=i, temperature=1.0), client="a")
    assert len(engine.constrained.compiler.jobs) == 1
    assert engine.num_compiling == 6 and engine.num_waiting == 0  # compiling requests are bounded apart from the queue
    release.set()
    outputs = run_until_done(engine)
    assert all(outputs[f"r-{i}"][-1].finish_reason == FinishReason.STOP for i in range(6))


def test_a_cached_grammar_needs_no_compile(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint)
    engine.add_request("first", PROMPT, regex_params("ab"))
    run_until_done(engine)
    engine.add_request("again", PROMPT, regex_params("ab"))
    assert not engine.constrained.compiling and engine.num_waiting == 1


def test_uncached_compiles_are_bounded_per_engine(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint, compile_budget=CompileBudget(per_engine=2, per_client=1))
    release = hold_compiles(engine)
    engine.add_request("a", PROMPT, regex_params("a+"), client="a")
    engine.add_request("b", PROMPT, regex_params("b+"), client="b")
    engine.add_request("b-same", PROMPT, regex_params("b+"), client="c")  # joins b's compile: no new job
    with pytest.raises(CompilesBusyError) as refused:
        engine.add_request("c", PROMPT, regex_params("c+"), client="c")
    assert refused.value.limit is CompileLimit.PER_ENGINE and "max_queued_grammar_compiles" in str(refused.value)
    assert "c" not in engine.requests
    engine.add_request("plain", PROMPT, SamplingParams(max_tokens=3), client="c")  # no grammar: not bounded by compiles
    release.set()
    outputs = run_until_done(engine)
    assert sorted(outputs) == ["a", "b", "b-same", "plain"]
    assert all(o[-1].finish_reason != FinishReason.ERROR for o in outputs.values())
    engine.add_request("c", PROMPT, regex_params("c+"), client="c")  # the budget is free again


def test_uncached_compiles_are_bounded_per_client(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint, compile_budget=CompileBudget(per_engine=8, per_client=2))
    release = hold_compiles(engine)
    engine.add_request("a1", PROMPT, regex_params("a"), client="greedy")
    engine.add_request("a2", PROMPT, regex_params("aa"), client="greedy")
    with pytest.raises(CompilesBusyError) as refused:
        engine.add_request("a3", PROMPT, regex_params("aaa"), client="greedy")
    assert refused.value.limit is CompileLimit.PER_CLIENT and "max_client_grammar_compiles" in str(refused.value)
    engine.add_request("other", PROMPT, regex_params("b"), client="someone else")
    release.set()
    outputs = run_until_done(engine)
    assert sorted(outputs) == ["a1", "a2", "other"]


def test_a_compile_past_the_deadline_fails_its_requests_alone(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint, compile_budget=CompileBudget(timeout_s=0.05))
    release = hold_compiles(engine)
    engine.add_request("slow-0", PROMPT, regex_params("z+"), client="a")
    engine.add_request("slow-1", PROMPT, regex_params("z+"), client="a")
    engine.add_request("plain", PROMPT, SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
    outputs: dict[str, list[EngineOutput]] = {}
    while {"slow-0", "slow-1", "plain"} - {r for r, o in outputs.items() if o[-1].finish_reason is not None}:
        for output in engine.step():
            outputs.setdefault(output.request_id, []).append(output)
    for request_id in ("slow-0", "slow-1"):
        error = outputs[request_id][-1].error
        assert outputs[request_id][-1].finish_reason == FinishReason.ERROR and error is not None and error.client_fault
        assert "grammar_compile_timeout_s" in error.message
    assert len(output_ids(outputs["plain"])) == 5
    with pytest.raises(InvalidRequestError, match="grammar_compile_timeout_s"):  # remembered: refused at once
        engine.add_request("slow-again", PROMPT, regex_params("z+"))
    compiler = engine.constrained.compiler
    [job] = compiler.jobs.values()  # counted against the budget while the worker is still busy with it
    release.set()
    job.future.result(timeout=30)
    engine.constrained.compiled()
    assert not compiler.jobs and not compiler._cache  # the late result is not cached


def test_grammar_limits_reach_llguidance():
    limits = GrammarLimits(max_lexer_states=100, initial_lexer_fuel=2000, step_lexer_fuel=3000, step_max_items=400, max_items_in_row=50, max_grammar_size=5000)
    parser = parser_limits(limits)
    assert (parser.max_lexer_states, parser.initial_lexer_fuel, parser.step_lexer_fuel) == (100, 2000, 3000)
    assert (parser.step_max_items, parser.max_items_in_row, parser.max_grammar_size, parser.verbose_errors) == (400, 50, 5000, False)
    wide = StructuredOutputs(json={"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(400)}})
    assert grammar_error(wide, GrammarLimits()) is None
    assert grammar_error(wide, GrammarLimits(max_grammar_size=500)) is not None


def test_a_grammar_over_the_lexer_state_limit_fails_only_its_request(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint, grammar_limits=GrammarLimits(max_lexer_states=20))
    wide = SamplingParams(temperature=1.0, seed=1, max_tokens=40, structured_outputs={"regex": "[a-z]{1,30}-[0-9a-f]{8}"})
    engine.add_request("wide", PROMPT, wide)
    engine.add_request("plain", PROMPT, SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
    outputs = run_until_done(engine)
    assert outputs["wide"][-1].finish_reason == FinishReason.ERROR
    assert len(output_ids(outputs["plain"])) == 5


def test_constrained_rows_wait_behind_their_cap(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint, max_constrained_rows=1)
    for i in range(3):
        engine.add_request(f"c-{i}", PROMPT, regex_params("[0-9]{4}"))
    engine.add_request("plain", PROMPT, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    outputs: dict[str, list[EngineOutput]] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            outputs.setdefault(output.request_id, []).append(output)
        assert sum(r.grammar is not None for r in engine.scheduler.running) <= 1
        assert engine.scheduler.num_constrained <= 1
    assert all(outputs[f"c-{i}"][-1].finish_reason == FinishReason.STOP for i in range(3))
    assert len(output_ids(outputs["plain"])) == 6
    assert engine.scheduler.num_constrained == 0


def test_plain_requests_do_not_wait_behind_capped_constrained_ones(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint, max_constrained_rows=1)
    engine.add_request("warm", PROMPT, regex_params("[0-9]{4}"))
    run_until_done(engine)  # the grammar is cached: the next ones queue at once
    for i in range(3):
        engine.add_request(f"c-{i}", PROMPT, regex_params("[0-9]{4}"))
    engine.add_request("plain", PROMPT, SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    engine.step()
    assert [r.request_id for r in engine.scheduler.running] == ["c-0", "plain"]
    assert [r.request_id for r in engine.scheduler.waiting] == ["c-1", "c-2"]


def test_zero_constrained_rows_refuse_grammars(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint, max_constrained_rows=0)
    with pytest.raises(InvalidRequestError, match="max_constrained_rows"):
        engine.add_request("c", PROMPT, regex_params("a"))


def test_beam_rows_wait_behind_their_cap(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint, max_beam_rows=2)
    beam = SamplingParams(use_beam_search=True, n=2, max_tokens=4, ignore_eos=True)
    engine.add_request("s1", PROMPT, beam)
    engine.add_request("s2", PROMPT, beam)
    while engine.has_unfinished_requests():
        engine.step()
        assert engine.beams.num_rows <= 2 and sum(engine.beams.group_of(r) is not None for r in engine.scheduler.running) <= 2
    assert engine.beams.num_rows == 0
    with pytest.raises(InvalidRequestError, match="max_beam_rows"):
        engine.add_request("s3", PROMPT, SamplingParams(use_beam_search=True, n=3, max_tokens=4))


@given(st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=8), max_size=8), st.randoms())
def test_equal_constraints_share_a_key_whatever_their_order(properties, random):
    shuffled = list(properties.items())
    random.shuffle(shuffled)
    schema = {"type": "object", "properties": properties}
    assert StructuredOutputs(json=schema).key == StructuredOutputs(json={"properties": dict(shuffled), "type": "object"}).key
    assert StructuredOutputs(json=schema).key != StructuredOutputs(json=schema | {"required": ["x"]}).key
    assert StructuredOutputs(regex="a").key != StructuredOutputs(grammar="a").key


def test_a_job_that_ended_while_the_engine_was_idle_frees_its_share(tiny_checkpoint):
    engine = tiny_engine(tiny_checkpoint, compile_budget=CompileBudget(per_engine=1, per_client=1, timeout_s=0.05))
    release = hold_compiles(engine)
    engine.add_request("slow", PROMPT, regex_params("q+"), client="a")
    run_until_done(engine)  # failed past the deadline; the worker still compiles it
    [job] = engine.constrained.compiler.jobs.values()
    release.set()
    job.future.result(timeout=30)
    engine.add_request("next", PROMPT, regex_params("r+"), client="a")  # no step ran since the job ended
    assert run_until_done(engine)["next"][-1].finish_reason != FinishReason.ERROR
