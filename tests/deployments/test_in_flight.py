"""`max_choices_in_flight` is never exceeded, however many requests arrive together: the ingress's
own request path (in-process, without Serve: a real `Ingress` with the `tiny-random` tokenizer and
encode workers, in front of an engine client that tokenizes strings before it registers choices,
as `EngineClient.submit` does), and every way a request can end releases its reservation."""

from __future__ import annotations

import asyncio
import json

import pytest

from deployments.config import ServeArgs
from deployments.in_flight import ChoiceReservations
from deployments.openai.errors import APIError
from tests.deployments.in_process import WAIT_S, FakeEngineClient, chat, completion, ingress, post, until

LIMIT = 8


@pytest.mark.timeout(2 * WAIT_S)
def test_many_requests_at_once_never_pass_the_limit():
    async def run() -> None:
        client = FakeEngineClient()
        replica = ingress(client, max_choices_in_flight=LIMIT)
        requests = [completion(n=1 + i % 3) if i % 2 else chat(n=1 + i % 3) for i in range(60)]
        tasks = [asyncio.create_task(replica(request)) for request in requests]
        await until(lambda: sum(task.done() for task in tasks) + client.collecting == len(tasks))  # each refused or holding its choices
        assert client.router.most <= LIMIT and replica.in_flight.reserved == 0
        refused = [task.result() for task in tasks if task.done()]
        assert refused and all(response.status_code == 503 for response in refused)
        assert all(json.loads(r.body)["error"]["code"] == "too_many_choices_in_flight" for r in refused)
        client.finish.set()
        answered = [await asyncio.wait_for(task, WAIT_S) for task in tasks]
        assert sum(r.status_code == 200 for r in answered) == client.collecting + len(tasks) - len(refused) >= 1
        assert client.router.most <= LIMIT and client.router.streams == {} and replica.in_flight.reserved == 0

    asyncio.run(run())


@pytest.mark.timeout(2 * WAIT_S)
def test_every_way_a_request_ends_releases_its_reservation():
    async def run() -> None:
        client = FakeEngineClient()
        replica = ingress(client, max_choices_in_flight=LIMIT)
        too_long = await replica(completion(n=2, prompt="word " * 2000))  # refused by the encoder: 400
        assert too_long.status_code == 400 and replica.in_flight.reserved == 0
        empty = await replica(post("/v1/completions", {"model": "tiny-random", "prompt": [], "max_tokens": 4}))
        assert empty.status_code == 400 and replica.in_flight.reserved == 0
        for stage in ("submitting", "collecting"):  # the client leaves (Serve cancels its handler) before its choices stream, or after
            if stage == "submitting":
                client.gate.clear()
            left = asyncio.create_task(replica(completion(n=3)))
            await until(lambda: client.at_gate == 1 if stage == "submitting" else client.collecting == 1)  # noqa: B023
            assert replica.in_flight.reserved == (3 if stage == "submitting" else 0)
            left.cancel()
            with pytest.raises(asyncio.CancelledError):
                await left
            assert replica.in_flight.reserved == 0 and client.router.streams == {}
            client.gate.set()
        client.finish.set()
        assert (await replica(completion(n=LIMIT))).status_code == 200  # the whole limit is free again
        assert replica.in_flight.reserved == 0 and client.router.streams == {}

    asyncio.run(run())


def test_a_reservation_past_the_limit_is_a_503_and_releases_once():
    reservations = ChoiceReservations()
    limits = ServeArgs(model="tiny-random", max_choices_in_flight=LIMIT)
    first = reservations.reserve(limits, 2, 4)
    with pytest.raises(APIError) as refused:
        reservations.reserve(limits, 2, 3)
    assert (refused.value.status, refused.value.code) == (503, "too_many_choices_in_flight")
    assert "streaming or preparing 6 choices" in refused.value.message
    first.release()
    first.release()
    assert reservations.reserved == 0
    with pytest.raises(RuntimeError), reservations.reserve(limits, 0, LIMIT):
        raise RuntimeError("an error inside the request")
    assert reservations.reserved == 0
