"""Speculative decoding and classifier-free guidance through the HTTP API."""

from __future__ import annotations

from tests.e2e.probes import gauges

PASSAGE = "The quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat by the door."
PROMPT = f"Repeat this sentence exactly, three times.\n{PASSAGE}\n{PASSAGE}\n"


def engine_counter(server, kind: str) -> float:
    with server.http() as http:
        return gauges(http)[f"spout:spec_decode_num_{kind}_tokens_total"]  # summed over the engines


def test_speculation_gives_the_greedy_text_and_reports_its_drafts(server):
    client = server.openai()
    plain = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=24, temperature=0.0)
    drafted_before = engine_counter(server, "draft")
    speculated = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=24, temperature=0.0, extra_body={"num_speculative_tokens": 4})
    assert speculated.choices[0].text == plain.choices[0].text
    details = speculated.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0
    assert engine_counter(server, "draft") - drafted_before == details.accepted_prediction_tokens + details.rejected_prediction_tokens
    assert plain.usage.completion_tokens_details is None or plain.usage.completion_tokens_details.accepted_prediction_tokens == 0


def test_speculation_streams_the_same_text(server):
    client = server.openai()
    body = {"model": server.model, "prompt": PROMPT, "max_tokens": 24, "temperature": 0.0}
    full = client.completions.create(**body, extra_body={"num_speculative_tokens": 4})
    chunks = list(client.completions.create(**body, stream=True, extra_body={"num_speculative_tokens": 4}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text


def test_guidance_runs_and_counts_only_the_request(server):
    client = server.openai()
    guided = client.completions.create(
        model=server.model, prompt="The capital of France is", max_tokens=8, temperature=0.0,
        extra_body={"guidance_scale": 3.0, "negative_prompt": "The capital of Germany is"},
    )  # fmt: skip
    plain = client.completions.create(model=server.model, prompt="The capital of France is", max_tokens=8, temperature=0.0)
    assert guided.usage.prompt_tokens == plain.usage.prompt_tokens
    assert 0 < guided.usage.completion_tokens <= 8
    assert len(guided.choices) == 1


def test_bad_speculation_and_guidance_values_get_400(server):
    with server.http() as http:
        for extra, param in [
            ({"num_speculative_tokens": 99}, "num_speculative_tokens"),
            ({"prompt_lookup_min": 3, "prompt_lookup_max": 2}, None),
            ({"guidance_scale": "strong"}, "guidance_scale"),
            ({"negative_prompt": 5}, "negative_prompt"),
        ]:
            response = http.post("/v1/completions", json={"model": server.model, "prompt": "x", "max_tokens": 2} | extra)
            assert response.status_code == 400, extra
            error = response.json()["error"]
            assert error["type"] == "invalid_request_error"
            if param is not None:
                assert error["param"] == param
