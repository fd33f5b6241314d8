"""`EventStream` with a fake ASGI server: frames in order, a final frame sent with the body's end, and a
client that leaves mid-stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from deployments.openai.event_stream import PING_FRAME, EventStream, FinalFrame


async def _serve(stream: EventStream, receive_messages: asyncio.Queue) -> list[dict]:
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    await stream({"type": "http"}, receive_messages.get, send)
    return sent


def test_frames_are_sent_in_order_then_the_body_ends():
    async def frames() -> AsyncGenerator[str, None]:
        for i in range(3):
            yield f"data: {i}\n\n"

    async def run() -> list[dict]:
        left: list[bool] = []
        sent = await _serve(EventStream(frames(), lambda: left.append(True)), asyncio.Queue())
        assert not left
        return sent

    sent = asyncio.run(asyncio.wait_for(run(), 10))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert (b"content-type", b"text/event-stream; charset=utf-8") in sent[0]["headers"]
    assert not any(name == b"content-length" for name, _ in sent[0]["headers"])
    assert [m["body"] for m in sent[1:]] == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n", b""]
    assert [m["more_body"] for m in sent[1:]] == [True, True, True, False]


def test_a_final_frame_goes_out_with_the_end_of_the_body():
    async def frames() -> AsyncGenerator[str, None]:
        yield "data: 0\n\n"
        yield FinalFrame("data: [DONE]\n\n")

    sent = asyncio.run(asyncio.wait_for(_serve(EventStream(frames(), lambda: None), asyncio.Queue()), 10))
    assert [(m["body"], m["more_body"]) for m in sent[1:]] == [(b"data: 0\n\n", True), (b"data: [DONE]\n\n", False)]


def test_a_client_that_leaves_is_reported_at_once_and_sent_nothing_more():
    async def run() -> tuple[list[dict], list[str]]:
        events: list[str] = []
        wake = asyncio.Event()

        async def frames() -> AsyncGenerator[str, None]:
            try:
                yield "data: first\n\n"
                await wake.wait()  # the generation waits for outputs until on_disconnect wakes it
                yield "data: after the client left\n\n"
            finally:
                events.append("frames closed")

        def on_disconnect() -> None:
            events.append("disconnect")
            wake.set()

        messages: asyncio.Queue = asyncio.Queue()
        serving = asyncio.create_task(_serve(EventStream(frames(), on_disconnect), messages))
        await asyncio.sleep(0.05)
        assert events == []
        await messages.put({"type": "http.disconnect"})
        return await serving, events

    sent, events = asyncio.run(asyncio.wait_for(run(), 10))
    assert events == ["disconnect", "frames closed"]
    assert [m.get("body") for m in sent[1:]] == [b"data: first\n\n"]


def test_a_response_cut_short_before_its_first_frame_still_releases_the_request():
    async def run() -> list[str]:
        events: list[str] = []

        async def frames() -> AsyncGenerator[str, None]:
            events.append("frames started")
            yield "data: never sent\n\n"

        async def failing_send(message: dict) -> None:
            raise OSError("the connection is gone")

        stream = EventStream(frames(), lambda: events.append("disconnect"))
        try:
            await stream({"type": "http"}, asyncio.Queue().get, failing_send)
        except OSError:
            events.append("error raised")
        return events

    assert asyncio.run(asyncio.wait_for(run(), 10)) == ["disconnect", "error raised"]


def _frames_after(delays_s: list[float]):
    async def frames() -> AsyncGenerator[str, None]:
        for i, delay in enumerate(delays_s):
            await asyncio.sleep(delay)
            yield f"data: {i}\n\n"

    return frames()


def test_a_silent_stream_is_pinged_and_a_busy_one_is_not():
    async def run(delays_s: list[float]) -> list[bytes]:
        sent = await _serve(EventStream(_frames_after(delays_s), lambda: None, ping_interval_s=0.05), asyncio.Queue())
        return [m["body"] for m in sent[1:]]

    silent = asyncio.run(asyncio.wait_for(run([0.0, 0.3]), 10))
    assert silent[0] == b"data: 0\n\n" and silent[-2:] == [b"data: 1\n\n", b""]
    assert set(silent[1:-2]) == {PING_FRAME} and len(silent[1:-2]) >= 2
    busy = asyncio.run(asyncio.wait_for(run([0.01] * 20), 10))
    assert PING_FRAME not in busy


def test_a_ping_the_connection_refuses_reports_the_client_gone():
    async def run() -> list[str]:
        events: list[str] = []
        wake = asyncio.Event()

        async def frames() -> AsyncGenerator[str, None]:
            yield "data: first\n\n"
            await wake.wait()

        async def send(message: dict) -> None:
            if message.get("body") == PING_FRAME:
                raise OSError("the connection is gone")

        def on_disconnect() -> None:
            events.append("disconnect")
            wake.set()

        await EventStream(frames(), on_disconnect, ping_interval_s=0.05)({"type": "http"}, asyncio.Queue().get, send)
        return events

    assert asyncio.run(asyncio.wait_for(run(), 10)) == ["disconnect"]
