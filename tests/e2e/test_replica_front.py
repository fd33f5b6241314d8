"""``http_front=replica``: the ingress replica serves its own port, with no Serve proxy or HAProxy on
the path. The OpenAI client streams through it, a client that leaves is aborted in the engine, a
client that stops reading is cut off after http_write_timeout_s, hostile connections are refused
within their bounds beside a stream, and deleting the app lets a stream in flight end before the replica stops and frees the port."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from ray import serve

from bench.lib.serve_cluster import ServeCluster, free_port
from deployments import build_app
from deployments.driver import wait_until_healthy
from deployments.processes import port_is_free
from tests.e2e.probes import gauges, sse_payloads

MODEL = "tiny-random"
API_KEY = "front-key"
STARTUP_TIMEOUT_S = 300
SETTLE_S = 30.0
HEAD_TIMEOUT_S = 2.0
WRITE_TIMEOUT_S = 2.0
MAX_BODY_BYTES = 65_536


def deploy(cluster: ServeCluster, name: str) -> str:
    """A tiny-random app named ``name`` whose ingress replica serves a free port itself; its base URL."""
    port = free_port()
    options = {"model": MODEL, "api_key": API_KEY, "http_front": "replica", "http_port": str(port), "http_own_port_min": str(free_port())}
    options |= {"max_num_seqs": 16}  # two such apps run at once here: each replica's own port is drawn free too
    limits = {"http_head_timeout_s": str(HEAD_TIMEOUT_S), "http_write_timeout_s": str(WRITE_TIMEOUT_S), "max_body_bytes": str(MAX_BODY_BYTES)}
    app = build_app(options | limits)
    serve.run(app, name=name, route_prefix=f"/{name}", blocking=False)
    base_url = f"http://127.0.0.1:{port}"
    wait_until_healthy(base_url, STARTUP_TIMEOUT_S)
    return base_url


@pytest.fixture(scope="module")
def front(cluster: ServeCluster) -> Iterator[str]:
    base_url = deploy(cluster, "replica-front")
    yield base_url
    serve.delete("replica-front")


def test_the_openai_client_streams_through_the_replicas_own_port(front: str):
    client = openai.OpenAI(base_url=f"{front}/v1", api_key=API_KEY, timeout=60, max_retries=0)
    whole = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=24, temperature=0.0)
    streamed = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=24, temperature=0.0, stream=True)
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == whole.choices[0].text
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True)
    assert sum(1 for chunk in chat if chunk.choices and chunk.choices[0].delta.content) >= 1
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{front}/v1", api_key="wrong", max_retries=0).models.list()


def test_a_client_that_leaves_is_aborted_in_the_engine(front: str):
    async def leave_after_a_few_frames() -> None:
        body = {"model": MODEL, "prompt": "count", "max_tokens": 2000, "ignore_eos": True, "stream": True}
        headers = {"Authorization": f"Bearer {API_KEY}"}
        async with httpx.AsyncClient(base_url=front, headers=headers, timeout=60) as client:
            async with client.stream("POST", "/v1/completions", json=body) as response:
                frames = 0
                async for _ in sse_payloads(response):
                    frames += 1
                    if frames == 3:
                        break  # leaving the block closes the connection with the body unread

    asyncio.run(leave_after_a_few_frames())
    with httpx.Client(base_url=front, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as http:
        deadline = time.monotonic() + SETTLE_S
        while gauges(http)["spout:num_requests_running"] > 0:
            assert time.monotonic() < deadline, "the engine still runs the request of a client that left"
            time.sleep(0.2)


def test_a_client_that_stops_reading_is_cut_off_and_its_request_ends(front: str):
    """Three choices of 1,800 tokens with 20 logprobs each (about 6 MB of frames, more than the kernel's
    send buffer takes) to a client with a small receive buffer that reads nothing until the engine has
    stopped running the request: the replica cut it off once its socket had been full for
    http_write_timeout_s, so what the client then reads ends early, with no ``[DONE]`` (without the cut,
    reading resumes the stream and it runs to its ``[DONE]``)."""
    host, port = front.removeprefix("http://").split(":")
    fields = {"model": MODEL, "prompt": "count", "max_tokens": 1800, "n": 3, "ignore_eos": True, "logprobs": 20, "stream": True}
    body = json.dumps(fields).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {API_KEY}\r\ncontent-type: application/json\r\n"

    async def stop_reading() -> bytes:
        loop = asyncio.get_running_loop()
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            await loop.sock_connect(sock, (host, int(port)))
            await loop.sock_sendall(sock, head.encode() + b"content-length: %d\r\n\r\n" % len(body) + body)
            with httpx.Client(base_url=front, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as http:
                deadline = time.monotonic() + SETTLE_S
                while gauges(http)["spout:num_requests_running"] == 0:  # the request has started
                    assert time.monotonic() < deadline, "the request never ran"
                    await asyncio.sleep(0.1)
                deadline = time.monotonic() + 4 * SETTLE_S
                while gauges(http)["spout:num_requests_running"] > 0:  # cut off (or, without the cut, generated whole)
                    assert time.monotonic() < deadline, "the engine still runs the request of a client that reads nothing"
                    await asyncio.sleep(0.2)
            received = b""
            try:
                while chunk := await asyncio.wait_for(loop.sock_recv(sock, 65_536), SETTLE_S):
                    received += chunk
            except ConnectionResetError:
                pass
            return received

    received = asyncio.run(stop_reading())
    assert b"data: [DONE]" not in received, received[-200:]
    assert httpx.get(f"{front}/health", timeout=10).status_code == 200


def test_hostile_connections_are_refused_within_their_bounds_while_a_stream_runs(front: str):
    """A head past the size limit (431), garbage (400), a head that never ends (closed after
    http_head_timeout_s), a chunked body past max_body_bytes (413): each answered within its bound,
    while a stream beside them runs to its end."""
    host, port = front.removeprefix("http://").split(":")

    async def raw(data: bytes, then_wait: bool = False) -> tuple[bytes, float]:
        reader, writer = await asyncio.open_connection(host, int(port))
        started = time.monotonic()
        writer.write(data)
        answer = await asyncio.wait_for(reader.read(), SETTLE_S)
        writer.close()
        return answer, time.monotonic() - started

    async def stream() -> int:
        body = {"model": MODEL, "prompt": "count", "max_tokens": 400, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        async with httpx.AsyncClient(base_url=front, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120) as client:
            async with client.stream("POST", "/v1/completions", json=body) as response:
                frames = [line async for line in response.aiter_lines() if line.startswith("data: ")]
        assert frames[-1] == "data: [DONE]"
        return json.loads(frames[-2][len("data: ") :])["usage"]["completion_tokens"]

    async def main() -> None:
        key = f"authorization: Bearer {API_KEY}\r\n".encode()
        chunked = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n" + key + b"transfer-encoding: chunked\r\n\r\n"
        chunked += b"".join(b"%x\r\n%b\r\n" % (8192, b"x" * 8192) for _ in range(MAX_BODY_BYTES // 8192 + 4)) + b"0\r\n\r\n"
        streamed, big_head, garbage, slow, big_body = await asyncio.gather(
            stream(),
            raw(b"GET /health HTTP/1.1\r\nx-big: " + b"a" * 70_000 + b"\r\n\r\n"),
            raw(b"NOT HTTP\r\n\r\n"),
            raw(b"GET /health HTTP/1.1\r\nhost: x\r\n"),
            raw(chunked),
        )
        assert streamed == 400
        assert big_head[0].startswith(b"HTTP/1.1 431 ") and garbage[0].startswith(b"HTTP/1.1 400 ")
        assert slow[0] == b"" and HEAD_TIMEOUT_S - 0.5 < slow[1] < HEAD_TIMEOUT_S + 5
        assert big_body[0].startswith(b"HTTP/1.1 413 "), big_body[0][:200]

    asyncio.run(main())
    assert httpx.get(f"{front}/health", timeout=10).status_code == 200


def test_deleting_the_app_lets_a_stream_end_then_frees_the_port(cluster: ServeCluster):
    base_url = deploy(cluster, "replica-front-drain")
    port = int(base_url.rsplit(":", 1)[1])
    body = {"model": MODEL, "prompt": "count", "max_tokens": 1500, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=120) as http, http.stream("POST", "/v1/completions", json=body) as response:
        lines = response.iter_lines()
        frames = [next(line for line in lines if line.startswith("data: "))]
        serve.delete("replica-front-drain", _blocking=False)
        deadline = time.monotonic() + SETTLE_S
        while not refused(base_url):
            assert time.monotonic() < deadline, "the replica still takes new connections while it drains"
            frames.append(next(lines))
        frames += [line for line in lines if line.startswith("data: ")]
    assert frames[-1] == "data: [DONE]"
    usage = json.loads(frames[-2][len("data: ") :])
    assert usage["usage"]["completion_tokens"] == 1500, usage
    deadline = time.monotonic() + SETTLE_S
    while not port_is_free("127.0.0.1", port):
        assert time.monotonic() < deadline, f"port {port} is still held after the app was deleted"
        time.sleep(0.2)


def refused(base_url: str) -> bool:
    """Whether a new connection to ``base_url`` is refused, or closed unanswered (the draining replica
    stopped listening, and closes or resets the connections that carry no request)."""
    try:
        httpx.get(f"{base_url}/health", timeout=5)
    except httpx.TransportError:
        return True
    return False
