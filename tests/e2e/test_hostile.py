"""Hostile and careless requests, sent a group at a time while 4 greedy streams run on the same engine.

Every hostile request gets its OpenAI error JSON (or completes, where it is legal) within
a bounded wait; each of the 4 streams ends with exactly the text of its non-streaming twin;
the engine's incarnation never changes (a restart would change it). Floods (copies of one
costly request sent at once) also leave no stream waiting more than 5 s between frames, and
a newcomer's small chat request, sent a second later, is answered within 10 s.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx
import pytest
import ray

from tests.e2e.hostile_requests import CASE_GROUPS, CASES, FLOODS, HOSTILE_TIMEOUT_S, STREAM_TIMEOUT_S, Flood, Hostile, M
from tests.e2e.probes import sse_payloads

NUM_STREAMS = 4
STREAM_TOKENS = 40
STALL_LIMIT_S = 5.0
NEWCOMER_DELAY_S = 1.0
NEWCOMER_LIMIT_S = 10.0
NEWCOMER = {"model": M, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}


@dataclass(frozen=True)
class Streamed:
    text: str
    longest_wait_s: float
    """The longest wait between two frames after the first text."""


def stream_bodies() -> list[dict]:
    return [
        {"model": M, "prompt": f"Tell me a story about the number {i}.", "max_tokens": STREAM_TOKENS, "temperature": 0.0, "ignore_eos": True}
        for i in range(NUM_STREAMS)
    ]


@pytest.fixture(scope="module")
def twins(server) -> list[str]:
    """The non-streaming text of each stream's body, computed alone."""
    with server.http() as http:
        return [http.post("/v1/completions", json=body).json()["choices"][0]["text"] for body in stream_bodies()]


def incarnation(server) -> object:
    return ray.get(server.engine(0).stats.remote(), timeout=60)["incarnation"]


async def stream_text(client: httpx.AsyncClient, body: dict, started: asyncio.Event) -> Streamed:
    """The streamed text and the longest wait between frames; sets ``started`` on the first text."""
    text, longest_wait, last_frame = "", 0.0, None
    async with client.stream("POST", "/v1/completions", json=body | {"stream": True}) as response:
        assert response.status_code == 200, await response.aread()
        async for payload in sse_payloads(response):
            now = time.monotonic()
            if last_frame is not None:
                longest_wait = max(longest_wait, now - last_frame)
            if payload is None:
                return Streamed(text, longest_wait)
            assert "error" not in payload, payload
            text += "".join(choice["text"] for choice in payload["choices"])
            started.set()
            last_frame = now
    raise AssertionError("the stream ended without [DONE]")


def _client(server) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {server.api_key}"}
    return httpx.AsyncClient(base_url=server.base_url, headers=headers, timeout=STREAM_TIMEOUT_S)


async def _start_streams(client: httpx.AsyncClient) -> list[asyncio.Task[Streamed]]:
    """The 4 streams, once each has sent text."""
    started = [asyncio.Event() for _ in range(NUM_STREAMS)]
    streams = [asyncio.create_task(stream_text(client, body, s)) for body, s in zip(stream_bodies(), started)]
    await asyncio.wait_for(asyncio.gather(*(s.wait() for s in started)), STREAM_TIMEOUT_S)
    return streams


async def hostiles_next_to_streams(server, cases: list[Hostile]) -> tuple[list[httpx.Response], list[str]]:
    """The cases' requests sent at once beside the 4 streams, each answered within its bounded wait."""

    async def answered(case: Hostile) -> httpx.Response:
        response = await asyncio.wait_for(case.send(client), HOSTILE_TIMEOUT_S)
        await response.aread()
        return response

    async with _client(server) as client:
        streams = await _start_streams(client)
        responses = await asyncio.gather(*(answered(case) for case in cases))
        streamed = await asyncio.wait_for(asyncio.gather(*streams), STREAM_TIMEOUT_S)
    return responses, [s.text for s in streamed]


@dataclass(frozen=True)
class FloodOutcome:
    responses: list[httpx.Response]
    streamed: list[Streamed]
    newcomer: httpx.Response
    newcomer_s: float


async def flood_next_to_streams(server, flood: Flood) -> FloodOutcome:
    """The copies sent at once beside the streams, and a newcomer's request a second later (bounded waits)."""
    async with _client(server) as client:
        streams = await _start_streams(client)
        sent = [asyncio.create_task(send(client)) for send in flood.sends]
        await asyncio.sleep(NEWCOMER_DELAY_S)
        newcomer_sent = time.monotonic()
        newcomer = await asyncio.wait_for(client.post("/v1/chat/completions", json=NEWCOMER), NEWCOMER_LIMIT_S)
        newcomer_s = time.monotonic() - newcomer_sent
        responses = await asyncio.wait_for(asyncio.gather(*sent), flood.timeout_s)
        streamed = await asyncio.wait_for(asyncio.gather(*streams), STREAM_TIMEOUT_S)
    return FloodOutcome(responses, streamed, newcomer, newcomer_s)


def assert_answered(response: httpx.Response, statuses: tuple[int, ...], param: str | None, busy_code: str | None = None, anthropic: bool = False) -> None:
    """The status is one of ``statuses``, and an error is OpenAI error JSON naming ``param`` (a 400) or
    saying ``busy_code`` (another refusal); with ``anthropic``, Anthropic's error JSON."""
    assert response.status_code in statuses, response.text[:500]
    if response.status_code != 200 and anthropic:
        body = response.json()
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"} and body["error"]["message"], body
    elif response.status_code != 200:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["message"]
        if param is not None:
            assert error["param"] == param, error
        if busy_code is not None and response.status_code != 400:
            assert error["code"] == busy_code, error


def test_enough_kinds():
    assert len(CASES) >= 25


def case_failure(case: Hostile, response: httpx.Response) -> str | None:
    """Why ``response`` is not a right answer to ``case``, or None when it is."""
    try:
        assert_answered(response, case.statuses, case.param, anthropic=case.anthropic)
        if case.check is not None:
            case.check(response)
    except AssertionError as failure:
        return f"{case.name}: {failure}"
    return None


@pytest.mark.parametrize("cases", CASE_GROUPS, ids=[f"{cases[0].name} and {len(cases) - 1} more" for cases in CASE_GROUPS])
def test_hostile_requests_hurt_no_one(server, twins, cases):
    before = incarnation(server)
    responses, texts = asyncio.run(hostiles_next_to_streams(server, cases))
    failures = [failure for case, response in zip(cases, responses) if (failure := case_failure(case, response))]
    assert failures == []
    assert texts == twins
    assert incarnation(server) == before


@pytest.mark.parametrize("flood", FLOODS, ids=[f.name for f in FLOODS])
def test_a_flood_stalls_no_stream_and_no_newcomer(server, twins, flood):
    before = incarnation(server)
    outcome = asyncio.run(flood_next_to_streams(server, flood))
    for response in outcome.responses:
        assert_answered(response, flood.statuses, flood.param, flood.busy_code)
    assert outcome.newcomer.status_code == 200 and outcome.newcomer_s < NEWCOMER_LIMIT_S, outcome.newcomer.text[:500]
    assert [s.text for s in outcome.streamed] == twins
    assert max(s.longest_wait_s for s in outcome.streamed) < STALL_LIMIT_S, outcome.streamed
    assert incarnation(server) == before
