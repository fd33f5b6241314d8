"""Mailbox wake-ups under a stream interval and with a reader, and chunk frames as plain SSE of the chunk."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deployments.openai.errors import APIError
from deployments.openai.responses import ResponseFormat, sse
from deployments.streams import Mailbox


def test_stream_interval_wakes_for_the_first_token_then_every_n_tokens_and_the_end():
    async def run() -> list[list[int]]:
        mailbox = Mailbox(stream_interval=3)
        frames = []
        for token in range(8):
            mailbox.push(0, f"t{token}", [token], "length" if token == 7 else None, None, None)
            if mailbox.ready.is_set():
                frames.append((await mailbox.take())[0].token_ids)
        return frames

    assert asyncio.run(run()) == [[0], [1, 2, 3], [4, 5, 6], [7]]


def test_stream_interval_counts_each_choice_on_its_own():
    mailbox = Mailbox(stream_interval=2)
    mailbox.push(0, "a", [1], None, None, None)
    mailbox.push(1, "b", [2], None, None, None)
    assert mailbox.ready.is_set()  # first tokens go out at once
    asyncio.run(mailbox.take())
    mailbox.push(0, "c", [3], None, None, None)
    mailbox.push(1, "d", [4], None, None, None)
    assert not mailbox.ready.is_set()
    mailbox.push(1, "e", [5], None, None, None)
    assert mailbox.ready.is_set()


def test_a_mailbox_without_output_for_its_idle_timeout_fails_with_504():
    async def run() -> None:
        mailbox = Mailbox(idle_timeout_s=0.05)
        mailbox.push(0, "a", [1], None, None, None)
        assert (await mailbox.take())[0].token_ids == [1]  # output within the timeout is taken
        await mailbox.take()  # then nothing comes

    with pytest.raises(APIError) as raised:
        asyncio.run(run())
    assert raised.value.status == 504 and raised.value.code == "stream_timeout"


def test_a_reader_takes_what_finishes_nothing_and_the_take_gets_the_rest_in_order():
    """The reader takes each ready delta in the pusher's call (no wake) while it can; a delta it cannot
    take, a delta pushed while the take is woken, the finish and an error all go to the take."""

    async def run() -> tuple[list[str], list[str]]:
        mailbox = Mailbox(stream_interval=2)
        read: list[str] = []
        taken: list[str] = []
        able = True

        def reader(box: Mailbox) -> bool:
            if not able:
                return False
            read.append(box.take_now()[0].text)
            return True

        mailbox.reader = reader
        mailbox.push(0, "a", [1], None, None, None)  # the first delta: ready at once, read
        mailbox.push(0, "b", [2], None, None, None)  # interval 2: waits
        mailbox.push(0, "c", [3], None, None, None)  # ready: read
        assert not mailbox.ready.is_set()
        able = False
        mailbox.push(0, "d", [4], None, None, None)
        mailbox.push(0, "e", [5], None, None, None)  # the reader cannot: the take is woken
        assert mailbox.ready.is_set()
        able = True
        mailbox.push(0, "f", [6], None, None, None)
        mailbox.push(0, "g", [7], None, None, None)  # the take is already woken: these join what it takes
        taken.append((await mailbox.take())[0].text)
        mailbox.push(0, "h", [8], "stop", None, None)  # a finish goes to the take
        assert mailbox.ready.is_set()
        taken.append((await mailbox.take())[0].text)
        return read, taken

    assert asyncio.run(run()) == (["a", "bc"], ["defg", "h"])


def test_a_failed_mailbox_never_offers_its_reader_more():
    async def run() -> None:
        mailbox = Mailbox()
        mailbox.reader = lambda box: pytest.fail("read after the error")
        mailbox.fail(APIError(499, "gone", code="client_closed_request"))
        mailbox.push(0, "a", [1], None, None, None)
        await mailbox.take()

    with pytest.raises(APIError):
        asyncio.run(run())


@given(st.text(), st.booleans(), st.sampled_from([None, "stop", "length"]), st.one_of(st.none(), st.integers(0, 9), st.text(max_size=5)))
def test_chunk_frame_is_the_sse_of_the_chunk(text: str, chat: bool, finish: str | None, stop_reason: int | str | None):
    fmt = ResponseFormat.new("cmpl-x", 'model "q"', chat=chat)
    choices = [fmt.chunk_choice(0, text, finish, stop_reason), fmt.chunk_choice(1, text[::-1], None, None, role=chat)]
    assert fmt.chunk_frame(choices) == sse(fmt.chunk(choices))
    assert json.loads(fmt.chunk_frame(choices)[len("data: ") :])["choices"][0] == choices[0]


@given(st.text(), st.booleans(), st.integers(0, 300), st.sampled_from([None, "stop", "length"]), st.one_of(st.none(), st.integers(0, 9), st.text(max_size=5)))
def test_a_choice_written_from_the_template_is_the_json_of_the_choice(text: str, chat: bool, index: int, finish: str | None, stop_reason: int | str | None):
    fmt = ResponseFormat.new("cmpl-x", "m", chat=chat)
    encoded = fmt.choice_json(index, text, finish, stop_reason)
    assert json.loads(encoded) == fmt.chunk_choice(index, text, finish, stop_reason)
    assert fmt.encoded_chunk_frame([encoded]) == fmt.chunk_frame([fmt.chunk_choice(index, text, finish, stop_reason)])
    with_logprobs = {"tokens": [text], "token_logprobs": [-0.5], "top_logprobs": None, "text_offset": [0]}
    assert json.loads(fmt.choice_json(index, text, finish, stop_reason, logprobs=with_logprobs)) == fmt.chunk_choice(
        index, text, finish, stop_reason, with_logprobs
    )
