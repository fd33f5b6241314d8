"""Logprobs that JSON cannot hold (NaN, -inf) are written as vLLM writes them: NaN as null, -inf
(and anything under vLLM's floor) as -9999.0, so every SSE frame and body is valid JSON."""

from __future__ import annotations

import json
import math

from hypothesis import given
from hypothesis import strategies as st

from deployments.openai.logprobs import LOWEST_LOGPROB, LogprobEntry, chat_logprobs, completion_logprobs, prompt_logprob_entries, vllm_prompt_logprobs
from deployments.openai.responses import ResponseFormat
from detok import TokenString
from sampling.token_logprobs import PromptLogprobs, TokenLogprobs

TOKEN = TokenString("a", b"a")
LOGPROBS = st.one_of(st.floats(max_value=0.0), st.sampled_from([math.nan, -math.inf, -1e30]))


def reported(value: float) -> float | None:
    return None if math.isnan(value) else max(value, LOWEST_LOGPROB)


@given(st.lists(st.tuples(LOGPROBS, st.lists(LOGPROBS, max_size=3)), min_size=1, max_size=4))
def test_every_frame_with_any_logprobs_is_valid_json(rows):
    entries = [LogprobEntry(TOKEN, logprob, [(TOKEN, top) for top in tops]) for logprob, tops in rows]
    for chat in (True, False):
        fmt = ResponseFormat.new("id", "m", chat=chat)
        frame = fmt.chunk_frame([fmt.chunk_choice(0, "a", None, None, fmt.logprobs(entries, 0))])
        body = json.loads(frame[len("data: ") :], parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
        field = body["choices"][0]["logprobs"]
        got = [item["logprob"] for item in field["content"]] if chat else field["token_logprobs"]
        assert got == [reported(logprob) for logprob, _ in rows]


def test_nan_is_null_and_minus_infinity_is_vllms_floor():
    entry = LogprobEntry(TOKEN, math.nan, [(TOKEN, -math.inf)])
    assert chat_logprobs([entry])["content"][0]["logprob"] is None
    assert chat_logprobs([entry])["content"][0]["top_logprobs"][0]["logprob"] == -9999.0
    assert completion_logprobs([entry], 0)["top_logprobs"] == [{"a": -9999.0}]
    prompt = PromptLogprobs([1, 2], [TokenLogprobs(math.nan, 1, [3], [-math.inf])])
    scored = prompt_logprob_entries(prompt, (TOKEN, TOKEN, TOKEN))
    assert (
        json.dumps(vllm_prompt_logprobs(scored, 1), allow_nan=False)
        == '[null, {"2": {"logprob": null, "rank": 1, "decoded_token": "a"}, "3": {"logprob": -9999.0, "rank": 1, "decoded_token": "a"}}]'
    )
