"""The engine channel in-process, over loopback: a poll's and a call's round trip, the token, frames that
break the protocol, and connections dropped mid-call."""

from __future__ import annotations

import asyncio
import json
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deployments.engine_actor import Added, Polled
from deployments.engine_channel import (
    KEEPALIVE,
    LENGTH,
    MAX_FRAME_BYTES,
    ChannelAddress,
    ChannelCall,
    ChannelError,
    ChannelServer,
    EngineCallError,
    EngineChannel,
    EngineMethod,
    read_frame,
    write_frame,
)
from engine.outputs import EngineOutput, FinishReason
from tests.deployments.test_engine_client import Remote

WAIT_S = 30.0
UNPICKLED: list[str] = []
"""What `Tripwire` objects recorded when something unpickled them."""


class Tripwire:
    """Records its unpickling: a frame that carries one shows whether the engine unpickled it."""

    def __reduce__(self):
        return (UNPICKLED.append, ("unpickled",))


class FakeEngine:
    """An engine handle with a real channel: its poll answers from ``replies`` (then waits its timeout),
    its adds answer ``Added`` or raise for a request named "boom"; every call is recorded; ``lookups``
    counts the address lookups (one per connection)."""

    def __init__(self, replies: list[Polled]) -> None:
        self.replies = iter(replies)
        self.calls: list[tuple] = []
        self.lookups = 0
        self.channel = ChannelServer({EngineMethod.GET_OUTPUTS: self._poll, EngineMethod.ADD_REQUESTS: self._add}, "127.0.0.1")
        self.channel_address = Remote(self._address)

    async def _address(self) -> ChannelAddress:
        self.lookups += 1
        return await self.channel.address()

    async def _poll(self, subscriber: str, timeout_s: float, aborts: list[str]) -> Polled:
        self.calls.append(("get_outputs", subscriber, timeout_s, aborts))
        reply = next(self.replies, None)
        if reply is None:
            await asyncio.sleep(timeout_s)
            return Polled(7, [])
        return reply

    async def _add(self, subscriber: str, request_ids: list[str]) -> Added:
        self.calls.append(("add_requests", subscriber, request_ids))
        if "boom" in request_ids:
            raise RuntimeError("the engine thread broke")
        return Added(7, [None] * len(request_ids))


def framed(payload: bytes) -> bytes:
    return LENGTH.pack(len(payload)) + payload


def run(work, timeout_s: float = WAIT_S):
    return asyncio.run(asyncio.wait_for(work, timeout_s))


async def connect(address: ChannelAddress, hello: object) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(address.host, address.port)
    write_frame(writer, json.dumps(hello).encode())
    return reader, writer


def test_a_poll_brings_the_engines_outputs_and_takes_the_aborts():
    outputs = [EngineOutput("a", [1, 2], 3), EngineOutput("b", [4], 5, FinishReason.STOP, stop_reason=9)]

    async def work() -> None:
        engine = FakeEngine([Polled(7, outputs), Polled(7, [], subscriber_lost=True)])
        channel = EngineChannel(engine, "replica-1")  # type: ignore[arg-type]
        first = await channel.poll(1.0, [])
        second = await channel.poll(0.5, ["x", "y"])
        assert (first.incarnation, first.outputs, first.subscriber_lost) == (7, outputs, False)
        assert second.subscriber_lost
        assert engine.calls == [("get_outputs", "replica-1", 1.0, []), ("get_outputs", "replica-1", 0.5, ["x", "y"])]
        assert engine.lookups == 1  # one connection for every poll
        channel.close()
        engine.channel.close()

    run(work())


def test_the_engine_keeps_each_connection_alive_so_that_a_dead_replicas_node_is_found():
    async def work() -> None:
        engine = FakeEngine([Polled(7, [])])
        channel = EngineChannel(engine, "replica-1")  # type: ignore[arg-type]
        await channel.poll(1.0, [])
        (served,) = engine.channel.connections
        connection = served.get_extra_info("socket")
        assert [connection.getsockopt(level, option) for level, option, _ in KEEPALIVE] == [value for _, _, value in KEEPALIVE]
        channel.close()
        engine.channel.close()

    run(work())


def test_a_call_answers_beside_a_waiting_poll_and_a_failed_call_keeps_its_connection():
    async def work() -> None:
        engine = FakeEngine([])  # polls wait their timeout
        channel = EngineChannel(engine, "replica-1")  # type: ignore[arg-type]
        polling = asyncio.ensure_future(channel.poll(5.0, []))
        added = await channel.call(EngineMethod.ADD_REQUESTS, "replica-1", ["r1", "r2"])
        assert added == Added(7, [None, None]) and not polling.done()
        with pytest.raises(EngineCallError, match="RuntimeError: the engine thread broke"):
            await channel.call(EngineMethod.ADD_REQUESTS, "replica-1", ["boom"])
        assert (await channel.call(EngineMethod.ADD_REQUESTS, "replica-1", ["r3"])).errors == [None]
        assert engine.lookups == 2  # the poll's connection and one for the calls, reused
        polling.cancel()
        channel.close()
        engine.channel.close()

    run(work())


def test_a_connection_without_the_token_is_closed_and_nothing_it_sent_is_unpickled():
    async def work() -> None:
        engine = FakeEngine([Polled(7, [])])
        address = await engine.channel.address()
        UNPICKLED.clear()
        for hello in ({"token": "0" * 64}, {"subscriber": "intruder"}, ["not", "a", "hello"], "{"):
            reader, writer = await asyncio.open_connection(address.host, address.port)
            write_frame(writer, (hello if isinstance(hello, str) else json.dumps(hello)).encode())
            write_frame(writer, pickle.dumps(ChannelCall("get_outputs", (Tripwire(), 0.1, ["victim"]))))
            with pytest.raises(asyncio.IncompleteReadError):
                await read_frame(reader, 1 << 20)
            writer.close()
        assert engine.calls == [] and UNPICKLED == []

    run(work())


@pytest.mark.parametrize(
    "frame",
    [
        LENGTH.pack(MAX_FRAME_BYTES + 1),  # announces more than a frame may hold
        framed(b"not a pickle"),
        framed(pickle.dumps(("get_outputs", ("broken", 1.0, [])))),  # not a ChannelCall
        framed(pickle.dumps(ChannelCall("shutdown", ()))),  # not a method the engine serves
    ],
)
def test_a_frame_that_breaks_the_protocol_closes_its_connection_and_the_engine_serves_on(frame):
    async def work() -> None:
        engine = FakeEngine([Polled(7, [])])
        address = await engine.channel.address()
        reader, writer = await connect(address, {"token": address.token})
        writer.write(frame)
        with pytest.raises(asyncio.IncompleteReadError):
            await read_frame(reader, 1 << 20)
        writer.close()
        assert engine.calls == []
        polled = await EngineChannel(engine, "good").poll(1.0, [])  # type: ignore[arg-type]
        assert polled.incarnation == 7 and engine.calls == [("get_outputs", "good", 1.0, [])]
        engine.channel.close()

    run(work())


def test_a_cancelled_poll_drops_its_connections_and_the_next_poll_connects_again():
    """A late answer on the old connection would be taken for the next poll's: it must not be read."""

    async def work() -> None:
        engine = FakeEngine([])  # every poll waits its timeout
        channel = EngineChannel(engine, "replica-1")  # type: ignore[arg-type]
        await channel.call(EngineMethod.ADD_REQUESTS, "replica-1", ["r1"])
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(channel.poll(0.3, ["a"]), 0.1)
        assert channel.polling is None and channel.idle == []  # the calls' connection went too
        engine.replies = iter([Polled(8, [EngineOutput("b", [5], 1)])])
        polled = await channel.poll(1.0, [])
        assert polled.incarnation == 8 and [o.request_id for o in polled.outputs] == ["b"]
        assert engine.lookups == 3
        channel.close()
        engine.channel.close()

    run(work())


def test_a_closed_engine_fails_the_poll_and_the_call_instead_of_hanging():
    async def work() -> None:
        engine = FakeEngine([])
        channel = EngineChannel(engine, "replica-1")  # type: ignore[arg-type]
        await channel.call(EngineMethod.ADD_REQUESTS, "replica-1", ["r1"])
        polling = asyncio.ensure_future(channel.poll(5.0, []))
        while len(engine.calls) < 2:
            await asyncio.sleep(0.01)
        engine.channel.close()  # the engine actor's process ends: its connections close
        with pytest.raises(ConnectionError):  # ChannelError for the end of the stream, or the reset itself
            await polling
        assert channel.polling is None and channel.idle == []

    run(work())


def test_an_engine_whose_port_is_gone_fails_the_call_with_a_channel_error():
    """What the engine client turns into a 503, as for a dead actor: not an OSError of another kind."""

    async def work() -> None:
        engine = FakeEngine([])
        address = await engine.channel.address()
        engine.channel.close()
        await engine.channel.server.wait_closed()

        async def stale_address() -> ChannelAddress:  # what a dead node's actor last said
            return address

        engine.channel_address = Remote(stale_address)
        channel = EngineChannel(engine, "replica-1")  # type: ignore[arg-type]
        with pytest.raises(ChannelError, match=f"127.0.0.1:{address.port}"):
            await channel.call(EngineMethod.ADD_REQUESTS, "replica-1", ["r1"])
        assert channel.idle == []

    run(work())


@settings(max_examples=40, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=70),
        lambda children: st.lists(children, max_size=3) | st.dictionaries(st.sampled_from(["token", "subscriber", "x"]), children, max_size=3),
        max_leaves=6,
    )
)
def test_any_hello_but_the_token_closes_the_connection_before_a_call_is_read(hello):
    async def work() -> None:
        engine = FakeEngine([Polled(7, [])])
        address = await engine.channel.address()
        UNPICKLED.clear()
        reader, writer = await connect(address, hello)
        write_frame(writer, pickle.dumps(ChannelCall("get_outputs", (Tripwire(), 0.1, []))))
        with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
            await read_frame(reader, 1 << 20)
        writer.close()
        assert engine.calls == [] and UNPICKLED == []
        engine.channel.close()

    run(work())
