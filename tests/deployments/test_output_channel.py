"""The engine's output channel in-process, over loopback: a poll's round trip, the token, frames that
break the protocol, and a connection dropped mid-poll."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deployments.engine_actor import Polled
from deployments.output_channel import (
    LENGTH,
    MAX_POLL_BYTES,
    ChannelAddress,
    ChannelError,
    ChannelServer,
    EngineChannel,
    parse_poll,
    read_frame,
    write_frame,
)
from engine.outputs import EngineOutput, FinishReason
from tests.deployments.test_engine_client import Remote

WAIT_S = 30.0


class PollingEngine:
    """An engine handle with a real channel whose long poll answers from ``replies`` and records each poll;
    ``lookups`` counts the address lookups (one per connection)."""

    def __init__(self, replies: list[Polled]) -> None:
        self.replies = iter(replies)
        self.polls: list[tuple[str, float, list[str]]] = []
        self.lookups = 0
        self.channel = ChannelServer(self._poll, "127.0.0.1")
        self.output_channel = Remote(self._address)

    async def _address(self) -> ChannelAddress:
        self.lookups += 1
        return await self.channel.address()

    async def _poll(self, subscriber: str, timeout_s: float, aborts: list[str]) -> Polled:
        self.polls.append((subscriber, timeout_s, aborts))
        reply = next(self.replies, None)
        if reply is None:
            await asyncio.sleep(timeout_s)
            return Polled(7, [])
        return reply


def framed(payload: bytes) -> bytes:
    return LENGTH.pack(len(payload)) + payload


def run(work, timeout_s: float = WAIT_S):
    return asyncio.run(asyncio.wait_for(work, timeout_s))


def test_a_poll_brings_the_engines_outputs_and_takes_the_aborts():
    outputs = [EngineOutput("a", [1, 2], 3), EngineOutput("b", [4], 5, FinishReason.STOP, stop_reason=9)]

    async def work() -> None:
        engine = PollingEngine([Polled(7, outputs), Polled(7, [], subscriber_lost=True)])
        channel = EngineChannel(engine, "replica-1")  # type: ignore[arg-type]
        first = await channel.poll(1.0, [])
        second = await channel.poll(0.5, ["x", "y"])
        assert (first.incarnation, first.outputs, first.subscriber_lost) == (7, outputs, False)
        assert second.subscriber_lost
        assert engine.polls == [("replica-1", 1.0, []), ("replica-1", 0.5, ["x", "y"])]
        assert engine.lookups == 1  # one connection for every poll
        channel.close()
        engine.channel.close()

    run(work())


def test_a_connection_without_the_token_is_closed_before_any_poll():
    async def work() -> None:
        engine = PollingEngine([Polled(7, [])])
        address = await engine.channel.address()
        for hello in ({"token": "0" * 64, "subscriber": "intruder"}, {"subscriber": "intruder"}, ["not", "a", "hello"]):
            reader, writer = await asyncio.open_connection(address.host, address.port)
            write_frame(writer, json.dumps(hello).encode())
            write_frame(writer, json.dumps({"timeout_s": 0.1, "aborts": ["victim"]}).encode())
            with pytest.raises(asyncio.IncompleteReadError):
                await read_frame(reader, 1 << 20)
            writer.close()
        assert engine.polls == []  # nobody's requests were aborted
        engine.channel.close()

    run(work())


@pytest.mark.parametrize(
    "frame",
    [
        LENGTH.pack(MAX_POLL_BYTES + 1),  # announces more than a poll may hold
        framed(b"{bad}"),
        framed(b'{"timeout_s": 1e9, "aborts": ["r"]}'),
        framed(b'{"timeout_s": 1, "aborts": [1]}'),
        framed(b'{"timeout_s": true, "aborts": []}'),
    ],
)
def test_a_frame_that_breaks_the_protocol_closes_its_connection_and_the_engine_serves_on(frame):
    async def work() -> None:
        engine = PollingEngine([Polled(7, [])])
        address = await engine.channel.address()
        reader, writer = await asyncio.open_connection(address.host, address.port)
        write_frame(writer, json.dumps({"token": address.token, "subscriber": "broken"}).encode())
        writer.write(frame)
        with pytest.raises(asyncio.IncompleteReadError):
            await read_frame(reader, 1 << 20)
        writer.close()
        assert engine.polls == []
        polled = await EngineChannel(engine, "good").poll(1.0, [])  # type: ignore[arg-type]
        assert polled.incarnation == 7 and engine.polls == [("good", 1.0, [])]
        engine.channel.close()

    run(work())


def test_a_cancelled_poll_drops_its_connection_and_the_next_poll_connects_again():
    """A late answer on the old connection would be taken for the next poll's: it must not be read."""

    async def work() -> None:
        engine = PollingEngine([])  # every poll waits its timeout
        channel = EngineChannel(engine, "replica-1")  # type: ignore[arg-type]
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(channel.poll(0.3, ["a"]), 0.1)
        assert channel.connection is None
        engine.replies = iter([Polled(8, [EngineOutput("b", [5], 1)])])
        polled = await channel.poll(1.0, [])
        assert polled.incarnation == 8 and [o.request_id for o in polled.outputs] == ["b"]
        assert engine.lookups == 2
        channel.close()
        engine.channel.close()

    run(work())


def test_a_closed_engine_fails_the_poll_instead_of_hanging():
    async def work() -> None:
        engine = PollingEngine([])
        channel = EngineChannel(engine, "replica-1")  # type: ignore[arg-type]
        polling = asyncio.ensure_future(channel.poll(5.0, []))
        while not engine.polls:
            await asyncio.sleep(0.01)
        engine.channel.close()  # the engine actor's process ends: its connections close
        with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
            await polling
        assert channel.connection is None

    run(work())


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
        lambda children: st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(["timeout_s", "aborts", "x"]), children, max_size=3),
        max_leaves=8,
    )
)
def test_parse_poll_takes_a_well_formed_poll_and_refuses_anything_else_with_an_error_the_server_catches(value):
    payload = json.dumps(value).encode()
    try:
        timeout_s, aborts = parse_poll(payload)
    except (ChannelError, KeyError, TypeError, ValueError):
        return
    assert isinstance(value, dict) and 0 <= timeout_s <= 60 and aborts == value["aborts"]
    assert all(isinstance(a, str) for a in aborts)
