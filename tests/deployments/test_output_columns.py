"""`Polled` crosses the wire as columns and comes back equal: plain outputs, finished ones, and
outputs with logprobs, errors, beams or drafts (which travel whole) in any order."""

from __future__ import annotations

import pickle

from hypothesis import given
from hypothesis import strategies as st

from deployments.engine_actor import Polled
from deployments.output_columns import to_columns
from engine.outputs import EngineOutput, FinishReason, Hypothesis, RequestError, TokenLogprobs


def outputs_strategy() -> st.SearchStrategy[EngineOutput]:
    extras = st.fixed_dictionaries(
        {},
        optional={
            "finish_reason": st.sampled_from(list(FinishReason)),
            "stop_reason": st.integers(0, 9),
            "logprobs": st.just([TokenLogprobs(-0.5, 1, [3], [-0.5])]),
            "error": st.just(RequestError("bad", True)),
            "beams": st.just([Hypothesis((1, 2), -1.0)]),
            "num_draft_tokens": st.integers(1, 3),
        },
    )
    return st.builds(
        lambda i, ids, prompt, extra: EngineOutput(f"r{i}", ids, prompt, **extra),
        st.integers(0, 999),
        st.lists(st.integers(0, 49151), max_size=3),
        st.integers(1, 100),
        extras,
    )


@given(st.lists(outputs_strategy(), max_size=12), st.integers(0, 5), st.booleans())
def test_polled_round_trips_through_pickle(outputs: list[EngineOutput], incarnation: int, lost: bool):
    polled = Polled(incarnation, outputs, subscriber_lost=lost)
    assert pickle.loads(pickle.dumps(polled, protocol=5)) == polled


def test_plain_outputs_travel_as_columns():
    outputs = [EngineOutput("a", [1], 5), EngineOutput("b", [2, 3], 6, FinishReason.STOP, 7), EngineOutput("c", [4], 5, logprobs=[])]
    ids, tokens, prompts, ends, whole = to_columns(outputs)
    assert (ids, tokens, prompts) == (["a", "b"], [[1], [2, 3]], [5, 6])
    assert ends == [(1, FinishReason.STOP, 7)] and whole == [(2, outputs[2])]
