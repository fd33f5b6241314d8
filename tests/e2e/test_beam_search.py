"""Beam search through the `openai` client on the default model: n beams, best first, deterministic."""

from __future__ import annotations

import openai
import pytest

PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "Name a fruit."}]
BEAM = {"use_beam_search": True, "ignore_eos": True}


def scores(prompt_tokens: int, token_logprobs: list[list[float]], length_penalty: float) -> list[float]:
    """Each beam's score: cumulative logprob / (prompt + output tokens) ** length_penalty (no beam ends on EOS here)."""
    return [sum(lps) / (prompt_tokens + len(lps)) ** length_penalty for lps in token_logprobs]


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0])
def test_completions_return_n_beams_best_first_deterministically(server, length_penalty):
    client = server.openai()

    def search():
        return client.completions.create(
            model=server.model,
            prompt=PROMPT,
            max_tokens=6,
            n=3,
            logprobs=2,
            extra_body=BEAM | {"length_penalty": length_penalty},
        )

    first, second = search(), search()
    assert [c.index for c in first.choices] == [0, 1, 2]
    beams = [c.logprobs.token_logprobs for c in first.choices]
    assert all(len(lps) == 6 for lps in beams) and all(c.finish_reason == "length" for c in first.choices)
    ranked = scores(first.usage.prompt_tokens, beams, length_penalty)
    assert ranked == sorted(ranked, reverse=True)
    assert len({tuple(c.logprobs.tokens) for c in first.choices}) == 3  # distinct beams
    assert first.usage.completion_tokens == 18
    assert [c.text for c in second.choices] == [c.text for c in first.choices]


def test_chat_returns_n_beams_best_first_deterministically(server):
    client = server.openai()

    def search():
        return client.chat.completions.create(model=server.model, messages=MESSAGES, max_tokens=5, n=2, logprobs=True, top_logprobs=1, extra_body=BEAM)

    first, second = search(), search()
    beams = [[entry.logprob for entry in c.logprobs.content] for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1] and all(len(lps) == 5 for lps in beams)
    assert scores(first.usage.prompt_tokens, beams, 1.0) == sorted(scores(first.usage.prompt_tokens, beams, 1.0), reverse=True)
    assert [c.message.content for c in second.choices] == [c.message.content for c in first.choices]


def test_a_streamed_search_sends_the_final_beams(server):
    client = server.openai()
    whole = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=6, n=2, extra_body=BEAM)
    texts = ["", ""]
    for chunk in client.completions.create(model=server.model, prompt=PROMPT, max_tokens=6, n=2, stream=True, extra_body=BEAM):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == [c.text for c in whole.choices]


@pytest.mark.parametrize(
    ("fields", "param"), [({"n": 9}, "n"), ({"n": 2, "top_k": 4}, "top_k"), ({"length_penalty": 2.0, "use_beam_search": False}, "length_penalty")]
)
def test_a_bad_beam_search_is_a_400_naming_the_field(server, fields, param):
    with pytest.raises(openai.BadRequestError) as refused:
        server.openai().completions.create(model=server.model, prompt=PROMPT, max_tokens=4, extra_body=BEAM | fields)
    assert refused.value.body["param"] == param


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}], "tool_choice": "required"}, "tool_choice"),
    ],
)
def test_an_output_constraint_with_a_chat_beam_search_is_a_400_naming_its_field(server, fields, param):
    with pytest.raises(openai.BadRequestError) as refused:
        server.openai().chat.completions.create(model=server.model, messages=MESSAGES, max_tokens=4, n=2, extra_body=BEAM, **fields)
    assert refused.value.body["param"] == param
