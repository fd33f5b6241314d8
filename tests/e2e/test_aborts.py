"""Aborts reach the engine within two steps: stop strings found by the detokenizer, and clients that leave."""

from __future__ import annotations

import json
import time

import ray

from deployments.engine_actor import LEAD_STEPS

PROMPT = "Count from one to fifty in words: one, two, three,"
WAIT_S = 30


def engine_request_id(response_id: str, choice: int = 0) -> str:
    return f"{response_id}-{choice}"


def test_stop_string_aborts_within_two_steps(server):
    client = server.openai()
    free = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=40, temperature=0.0, extra_body={"ignore_eos": True})
    text = free.choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 4]
    assert stop.strip(), text
    stopped = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=40, temperature=0.0, stop=[stop], extra_body={"ignore_eos": True})
    choice = stopped.choices[0]
    assert (choice.finish_reason, choice.model_extra["stop_reason"]) == ("stop", stop)
    assert choice.text == text[: text.index(stop)]
    generated = ray.get(server.engine().num_generated.remote([engine_request_id(stopped.id)]), timeout=WAIT_S)
    # The engine runs at most two steps past the outputs the ingress has routed (step credits).
    assert generated[engine_request_id(stopped.id)] <= stopped.usage.completion_tokens + LEAD_STEPS - 1


def test_disconnect_frees_the_slot_within_two_steps(server):
    body = {"model": server.model, "prompt": PROMPT, "max_tokens": 500, "temperature": 0.0, "ignore_eos": True, "stream": True}
    engine = server.engine()
    with server.http() as http, http.stream("POST", "/v1/completions", json=body) as response:
        frames = 0
        for line in response.iter_lines():
            if line.startswith("data: {"):
                response_id = json.loads(line[6:])["id"]
                frames += 1
            if frames == 3:
                break
        request_id = engine_request_id(response_id)
        at_close = ray.get(engine.num_generated.remote([request_id]), timeout=WAIT_S)[request_id]
    deadline = time.monotonic() + WAIT_S
    while ray.get(engine.stats.remote(), timeout=WAIT_S)["running"] and time.monotonic() < deadline:
        time.sleep(0.01)
    final = ray.get(engine.num_generated.remote([request_id]), timeout=WAIT_S)[request_id]
    assert final < 500
    assert final - at_close <= 2
