"""Fuzzing the ingress from its own OpenAPI document (``GET /openapi.json``).

Bodies are drawn from the document's JSON schemas (`tests.e2e.schema_strategy`), capped so
a case costs at most a few engine steps (``max_tokens`` <= 4, ``n`` <= 2, short arrays
and strings), and mixed with malformed ones: invalid JSON and bytes, wrong types,
huge numbers, any unicode (lone surrogates included), missing fields, non-objects.
Every answer must be 2xx, 4xx or 503, every non-2xx OpenAI error JSON, every stream
well formed; afterwards the server is healthy and a greedy request gives its text.

CI runs 300 cases; ``SPOUT_E2E_FULL=1`` runs 2,000.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time

import httpx
import jsonschema
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from tests.e2e.probes import FULL_SIZE, greedy_text
from tests.e2e.schema_strategy import DEFAULT_MAX_ITEMS, DEFAULT_MAX_LENGTH, from_schema

NUM_CASES = 2000 if FULL_SIZE else 300
ENDPOINTS = {
    "/v1/completions": "CompletionRequest",
    "/v1/chat/completions": "ChatCompletionRequest",
    "/v1/responses": "ResponsesRequest",
    "/v1/messages": "MessagesRequest",
}
OUTPUT_BOUND = {"ResponsesRequest": "max_output_tokens"}
"""The field that bounds an endpoint's output, when it is not ``max_tokens``."""
OTHER_PATHS = {"/tokenize", "/detokenize", "/v1/messages/count_tokens"}
"""Documented endpoints this test does not fuzz."""
# (minimum, maximum). CAPS are kept as drawn by the malformed cases too: a chat without them
# runs to the context's end.
CAPS = {"max_tokens": (1, 4), "max_completion_tokens": (1, 4), "max_output_tokens": (1, 4), "min_tokens": (0, 4)}
SMALL = {"n": (1, 2), "best_of": (1, 2)}
# JSON number literals (written into the body text: Python's json cannot write some of them).
HUGE_NUMBERS = ["1e30", "-1e30", "9223372036854775808", "18446744073709551616", "-9223372036854775809", "1" + "0" * 5000, "1e400", "-1e400", "5e-324"]
HUGE_NUMBERS += ["NaN", "Infinity", "-Infinity"]  # not JSON, but Python's json reads them
HUGE = "<huge number>"
ERROR_KEYS = {"message", "type", "param", "code"}
CONCURRENCY = 32  # the engine's max_num_seqs in the test app


def body_schema(document: dict, name: str, model: str) -> dict:
    """The endpoint's body schema, capped, with the served model and the refs it needs."""
    schema = copy.deepcopy(document["components"]["schemas"][name])
    properties = schema["properties"]
    for field, (low, high) in (CAPS | SMALL).items():
        if field in properties:
            properties[field] = {"type": "integer", "minimum": low, "maximum": high}
    properties["model"] = {"const": model}
    schema["required"] = sorted({*schema["required"], OUTPUT_BOUND.get(name, "max_tokens")})  # chat without it runs to the context's end
    return schema | {"components": document["components"]}


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=DEFAULT_MAX_LENGTH),
    lambda children: st.lists(children, max_size=DEFAULT_MAX_ITEMS) | st.dictionaries(st.text(max_size=8), children, max_size=DEFAULT_MAX_ITEMS),
    max_leaves=8,
)
ANY_TEXT = st.lists(st.characters(codec=None) | st.characters(categories=["Cs"]), max_size=DEFAULT_MAX_LENGTH).map("".join)  # lone surrogates too


@st.composite
def malformed(draw: st.DrawFn, body: dict) -> bytes:
    """A body spoilt in one of the ways clients spoil them."""
    kinds = ["wrong_type", "huge_number", "unicode", "missing_field", "not_an_object", "bad_json", "bad_bytes", "deep_nesting"]
    kind = draw(st.sampled_from(kinds))
    body = dict(body)
    field = draw(st.sampled_from(sorted(set(body) - set(CAPS))))
    if kind == "wrong_type":
        body[field] = draw(JSON_VALUES)
    elif kind == "huge_number":
        body[draw(st.sampled_from([field, "n", "temperature", "seed", "top_k", "logprobs", "dry_allowed_length"]))] = HUGE
        return json.dumps(body).replace(json.dumps(HUGE), draw(st.sampled_from(HUGE_NUMBERS))).encode()
    elif kind == "unicode":
        text_field = "prompt" if "prompt" in body else "input" if "input" in body else "messages"
        value = draw(ANY_TEXT)
        body[text_field] = value if text_field in ("prompt", "input") else [{"role": "user", "content": value}]
        body["stop"] = draw(st.lists(ANY_TEXT, max_size=2))
    elif kind == "missing_field":
        del body[field]
    elif kind == "not_an_object":
        return json.dumps(draw(JSON_VALUES.filter(lambda v: not isinstance(v, dict)))).encode()
    elif kind == "bad_json":
        text = json.dumps(body)
        return text[: draw(st.integers(0, max(0, len(text) - 1)))].encode()
    elif kind == "deep_nesting":
        depth = draw(st.sampled_from([100, 10_000, 30_000]))
        return json.dumps(body).replace(json.dumps(body[field]), "[" * depth + "]" * depth, 1).encode()
    else:
        return draw(st.binary(max_size=64))
    return json.dumps(body).encode()


def cases(document: dict, model: str) -> st.SearchStrategy[tuple[str, bytes]]:
    strategies = []
    for path, name in ENDPOINTS.items():
        valid = from_schema(body_schema(document, name, model))
        strategies.append(st.tuples(st.just(path), valid.map(lambda b: json.dumps(b).encode())))
        strategies.append(st.tuples(st.just(path), valid.flatmap(malformed)))
    return st.one_of(strategies)


def check_answer(path: str, response: httpx.Response) -> None:
    """2xx, 4xx or 503 for a full queue; non-2xx is the API's error JSON (OpenAI's, Anthropic's on the
    Messages API); a stream's frames are JSON ending as the API ends them, an error among them never a
    server error (an engine that died included)."""
    assert response.status_code < 500 or response.status_code == 503, response.text
    if response.status_code != 200:
        if path == "/v1/messages":
            body = response.json()
            assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, response.text
            return
        error = response.json()["error"]
        assert set(error) == ERROR_KEYS, response.text
        assert response.status_code != 503 or error["code"] == "server_full", response.text
        return
    if not response.headers["content-type"].startswith("text/event-stream"):
        assert {"/v1/responses": "output", "/v1/messages": "content"}.get(path, "choices") in response.json(), response.text
        return
    frames = [line[len("data: ") :] for line in response.text.splitlines() if line.startswith("data: ")]
    if path == "/v1/responses":
        last = json.loads(frames[-1])
        assert last["type"] in ("response.completed", "response.incomplete", "response.failed"), response.text
        assert last["type"] != "response.failed" or last["response"]["error"]["code"] == "invalid_prompt", response.text
        return
    if path == "/v1/messages":
        last = json.loads(frames[-1])
        assert last["type"] in ("message_stop", "error"), response.text
        assert last["type"] != "error" or last["error"]["type"] == "invalid_request_error", response.text
        return
    assert frames[-1] == "[DONE]", response.text
    for frame in map(json.loads, frames[:-1]):
        if "error" in frame:
            assert set(frame["error"]) == ERROR_KEYS and frame["error"]["type"] == "invalid_request_error", frame


def test_openapi_document_describes_the_request_bodies(server):
    with server.http() as http:
        document = http.get("/openapi.json").json()
    assert set(document["paths"]) == set(ENDPOINTS) | OTHER_PATHS
    completion = document["components"]["schemas"]["CompletionRequest"] | {"components": document["components"]}
    chat = document["components"]["schemas"]["ChatCompletionRequest"] | {"components": document["components"]}
    jsonschema.validate({"model": server.model, "prompt": "Hi", "max_tokens": 4, "top_k": 40, "stop": "."}, completion)
    jsonschema.validate({"model": server.model, "messages": [{"role": "user", "content": "Hi"}], "min_p": 0.1}, chat)
    for bad in ({"model": server.model, "prompt": "Hi", "temprature": 1.0}, {"model": server.model, "prompt": "Hi", "top_k": -2}, {"prompt": "Hi"}):
        assert not jsonschema.Draft202012Validator(completion).is_valid(bad), bad

    @settings(max_examples=100, deadline=None, derandomize=True, database=None)
    @given(from_schema(completion), from_schema(chat))
    def drawn_bodies_are_valid(completion_body: dict, chat_body: dict) -> None:
        jsonschema.validate(completion_body, completion)
        jsonschema.validate(chat_body, chat)

    drawn_bodies_are_valid()


def draw_cases(document: dict, model: str) -> list[tuple[str, bytes]]:
    """``NUM_CASES`` cases (and the explicit ones), drawn up front so they can be sent concurrently."""
    drawn: list[tuple[str, bytes]] = []

    @settings(
        max_examples=NUM_CASES,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(cases(document, model))
    @example(("/v1/completions", b'{"model": "m", "prompt": "x", "max_tokens": 1' + b"0" * 5000 + b"}"))  # once a 500
    @example(("/v1/completions", b'{"model": "m", "prompt": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"))  # once a 500
    @example(("/v1/completions", json.dumps({"model": model, "prompt": [[-3, 0]]}).encode()))  # once a 500
    @example(("/v1/completions", json.dumps({"model": model, "prompt": "x", "max_tokens": 1, "top_k": 2**63}).encode()))  # killed the engine
    @example(("/v1/chat/completions", json.dumps({"model": model, "messages": [{"role": "user", "content": "a\ud800"}]}).encode()))  # once a 500
    def collect(case: tuple[str, bytes]) -> None:
        drawn.append(case)

    collect()
    return drawn


async def send_all(server, drawn: list[tuple[str, bytes]]) -> tuple[dict[int, int], list[str]]:
    """Every case, ``CONCURRENCY`` at a time (so the engine batches the valid ones); statuses and failures."""
    statuses: dict[int, int] = {}
    failures: list[str] = []
    limit = asyncio.Semaphore(CONCURRENCY)
    headers = {"Authorization": f"Bearer {server.api_key}", "Content-Type": "application/json"}
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)

    async def send(client: httpx.AsyncClient, path: str, content: bytes) -> None:
        try:
            async with limit:
                response = await client.post(path, content=content)
        except httpx.HTTPError as error:
            failures.append(f"{path} {content[:300]!r}: {error!r}")
            return
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        try:
            check_answer(path, response)
        except AssertionError as error:
            failures.append(f"{path} {content[:300]!r}: {str(error)[:300]}")

    async with httpx.AsyncClient(base_url=server.base_url, headers=headers, timeout=120, limits=limits) as client:
        await asyncio.gather(*(send(client, path, content) for path, content in drawn))
    return statuses, failures


def test_fuzzed_requests_get_4xx_or_answers_and_leave_the_server_correct(server):
    with server.http() as http:
        expected = greedy_text(http, server.model)
        document = http.get("/openapi.json").json()
    started = time.monotonic()
    drawn = draw_cases(document, server.model)
    drawn_s = time.monotonic() - started
    statuses, failures = asyncio.run(send_all(server, drawn))
    print(
        f"\n{len(drawn)} fuzz cases: drawn in {drawn_s:.0f} s, answered in {time.monotonic() - started - drawn_s:.0f} s; "
        f"statuses {dict(sorted(statuses.items()))}"
    )
    assert len(drawn) >= NUM_CASES
    assert failures == []
    with server.http() as http:
        assert http.get("/health").status_code == 200
        assert greedy_text(http, server.model) == expected
