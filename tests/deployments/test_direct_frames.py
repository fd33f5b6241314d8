"""Frames written from the router's loop: a one-choice stream served by the replica's own HTTP server
(`deployments.http_server`, which offers its body writer) is written by `EngineClient`'s reader of the
request's mailbox, with no task woken per frame; its SSE is the same as the task's (the in-process ASGI
transport offers no body writer), through the real engine, for completions and chats, with usage,
logprobs and a stop string, for the Responses and Messages APIs, and for a client that reads slowly (its socket fills, the stream goes back
to the task while it is full and to the router's loop after); a request with several choices keeps the
task's path."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator

import httpx
import pytest

from deployments.http_exchange import Exchange
from deployments.http_server import Connection, HttpServer
from tests.deployments.served_in_process import WAIT_S, InProcessServer, asgi

HOST = "127.0.0.1"
COMPLETION = {"prompt": "The quick brown fox", "max_tokens": 24, "temperature": 0, "ignore_eos": True, "stream": True}
CHAT = {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 24, "temperature": 0, "ignore_eos": True, "stream": True}


@pytest.fixture(scope="module")
def served() -> Iterator[InProcessServer]:
    server = InProcessServer("tiny-random", max_num_seqs=16)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def ingress(served):
    return served.ingress()


@pytest.fixture(scope="module")
def http_port(served, ingress) -> Iterator[int]:
    server = HttpServer(asgi(ingress))
    served.run(server.start(HOST, 0))
    try:
        yield server.port
    finally:
        served.run(server.drain(0))


@pytest.fixture
def direct_writes(monkeypatch) -> list[int]:
    """One entry per chunk the server wrote through its body writer."""
    writes: list[int] = []
    write_now = Exchange.write_now

    def counted(self: Exchange, body: bytes) -> None:
        writes.append(len(body))
        write_now(self, body)

    monkeypatch.setattr(Exchange, "write_now", counted)
    return writes


def content(frames: list[dict]) -> dict:
    """What a stream says, whatever its frames' boundaries (steps coalesce when the ingress lags): the text,
    the logprobs' tokens and values, each finish, the last usage; and each frame's continuous usage
    checked against the tokens so far."""
    text, tokens, values, finishes, tokens_so_far = "", [], [], [], 0
    for frame in frames:
        for choice in frame["choices"]:
            text += choice["text"] if "text" in choice else choice["delta"].get("content") or ""
            if choice["logprobs"] is not None:
                tokens += choice["logprobs"]["tokens"]
                values += choice["logprobs"]["token_logprobs"]
                tokens_so_far += len(choice["logprobs"]["tokens"])
                if frame.get("usage") is not None:
                    assert frame["usage"]["completion_tokens"] == tokens_so_far
            finishes.append(choice["finish_reason"])
    return {"text": text, "tokens": tokens, "values": values, "finish": [f for f in finishes if f], "usage": frames[-1].get("usage")}


def data_frames(lines: list[str]) -> list[dict]:
    """The stream's data frames, parsed, without the ids and times that differ between requests."""
    frames = []
    for line in lines:
        if line.startswith("data: {"):
            frame = json.loads(line[len("data: ") :])
            frames.append({key: value for key, value in frame.items() if key not in ("id", "created")})
    return frames


async def stream(client: httpx.AsyncClient, path: str, body: dict) -> list[dict]:
    """The stream's data frames, parsed, without the ids and times that differ between requests."""
    async with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        return data_frames([line async for line in response.aiter_lines()])


def both_ways(served, ingress, http_port: int, path: str, body: dict) -> tuple[list[dict], list[dict]]:
    """The stream over loopback through the replica's server, and through the in-process transport."""

    async def run() -> tuple[list[dict], list[dict]]:
        async with httpx.AsyncClient(base_url=f"http://{HOST}:{http_port}", timeout=WAIT_S) as client:
            served_frames = await stream(client, path, body)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi(ingress)), base_url="http://spout.test", timeout=WAIT_S) as client:
            task_frames = await stream(client, path, body)
        return served_frames, task_frames

    return served.run(run())


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", COMPLETION),
        ("/v1/completions", COMPLETION | {"logprobs": 2, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}),
        ("/v1/chat/completions", CHAT | {"stream_options": {"include_usage": True}}),
    ],
    ids=["completion", "completion_logprobs_usage", "chat_usage"],
)
def test_frames_written_from_the_router_are_the_tasks_frames(served, ingress, http_port, direct_writes, path, body):
    body = body | {"model": served.model}
    served_frames, task_frames = both_ways(served, ingress, http_port, path, body)
    assert content(served_frames) == content(task_frames)
    token_frames = sum(1 for frame in served_frames if frame["choices"])
    # Every frame but the first few (before the head went) and the last (the task ends the stream) went directly.
    assert token_frames - 3 <= len(direct_writes) < token_frames, (token_frames, len(direct_writes))


def test_a_stop_string_ends_the_directly_written_stream_as_the_task_does(served, ingress, http_port, direct_writes):
    body = COMPLETION | {"model": served.model, "max_tokens": 48}
    free_text = "".join(frame["choices"][0]["text"] for frame in both_ways(served, ingress, http_port, "/v1/completions", body)[1])
    stop = free_text[len(free_text) // 2 :][:3]
    served_frames, task_frames = both_ways(served, ingress, http_port, "/v1/completions", body | {"stop": [stop]})
    assert content(served_frames) == content(task_frames)
    assert served_frames[-1]["choices"][0]["finish_reason"] == "stop"
    assert direct_writes


def test_several_choices_keep_the_tasks_path(served, ingress, http_port, direct_writes):
    body = COMPLETION | {"model": served.model, "n": 2, "temperature": 1.0, "seed": 7}
    served_frames, task_frames = both_ways(served, ingress, http_port, "/v1/completions", body)
    assert sorted(content(served_frames)["finish"]) == sorted(content(task_frames)["finish"]) == ["length", "length"]
    assert direct_writes == []


def test_a_slow_reader_falls_back_to_the_task_and_back_and_reads_the_tasks_stream(served, ingress, http_port, direct_writes, monkeypatch):
    """Small socket buffers on both ends and a client that waits before each read: the server's transport
    pauses, frames wait for the task, and direct writes resume once it drains; the text is the same."""
    made = Connection.connection_made

    def small_buffers(self: Connection, transport) -> None:
        made(self, transport)
        transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        transport.set_write_buffer_limits(high=2048)

    monkeypatch.setattr(Connection, "connection_made", small_buffers)
    body = COMPLETION | {"model": served.model, "max_tokens": 160, "logprobs": 5}  # about 800 bytes a frame

    async def slow_read() -> list[dict]:
        loop = asyncio.get_running_loop()
        with socket.socket() as sock:  # a bare socket: nothing reads ahead of the test
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            await loop.sock_connect(sock, (HOST, http_port))
            payload = json.dumps(body).encode()
            head = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            await loop.sock_sendall(sock, head % len(payload) + payload)
            raw = b""
            while chunk := await asyncio.wait_for(loop.sock_recv(sock, 2048), WAIT_S):
                raw += chunk
                await asyncio.sleep(0.05)  # about 40 KB/s, slower than the stream comes
        head, _, chunked = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        data, rest = b"", chunked
        while (size := int(rest.split(b"\r\n", 1)[0], 16)) > 0:
            rest = rest.split(b"\r\n", 1)[1]
            data, rest = data + rest[:size], rest[size + 2 :]
        return data_frames(data.decode().split("\n"))

    async def task_path() -> list[dict]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi(ingress)), base_url="http://spout.test", timeout=WAIT_S) as client:
            return await stream(client, "/v1/completions", body)

    slow = served.run(slow_read())
    assert content(slow) == content(served.run(task_path()))
    token_frames = sum(1 for frame in slow if frame["choices"])
    assert 0 < len(direct_writes) < token_frames - 3, (len(direct_writes), token_frames)  # both ways taken


def agent_content(frames: list[dict]) -> dict:
    """What a Responses or Messages stream says, whatever its deltas' boundaries: the text and the other events' types."""
    text, kinds = "", []
    for frame in frames:
        if frame["type"] == "response.output_text.delta":
            text += frame["delta"]
        elif frame["type"] == "content_block_delta" and frame["delta"]["type"] == "text_delta":
            text += frame["delta"]["text"]
        elif kinds[-1:] != [frame["type"]]:
            kinds.append(frame["type"])
    return {"text": text, "events": kinds}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/responses", {"input": "Tell me a story.", "max_output_tokens": 24, "temperature": 0, "stream": True}),
        ("/v1/messages", {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 24, "temperature": 0, "stream": True}),
    ],
    ids=["responses", "messages"],
)
def test_agent_api_streams_written_from_the_router_are_the_tasks(served, ingress, http_port, direct_writes, path, body):
    served_frames, task_frames = both_ways(served, ingress, http_port, path, body | {"model": served.model})
    assert agent_content(served_frames) == agent_content(task_frames)
    assert len(agent_content(served_frames)["text"]) > 0
    assert direct_writes  # the steps between the first and the last went from the router's loop
