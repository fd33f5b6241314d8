"""The replica's own HTTP server in-process, over loopback: sized and streamed responses, keep-alive and
pipelining, request bodies (sized, chunked, ``Expect: 100-continue``, larger than the read buffer),
the client leaving, the limits on a request's head, malformed input, drain, and ``SO_REUSEPORT``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.requests import Request
from starlette.responses import JSONResponse

from deployments.http_server import HttpServer, ServerLimits, listening_socket
from deployments.openai.event_stream import EventStream
from tests.deployments.http_serving import HOST, WAIT_S, exchange, run


async def echo_app(scope, receive, send) -> None:
    """Answers with what it was asked: method, path, query, a header, the body's length and hash."""
    request = Request(scope, receive)
    body = await request.body()
    answer = {
        "method": request.method,
        "path": request.url.path,
        "query": request.url.query,
        "x_test": request.headers.get("x-test"),
        "client": list(request.client or ()),
        "body_bytes": len(body),
        "body_sum": sum(body) % 65_521,
    }
    await JSONResponse(answer)(scope, receive, send)


def test_sized_responses_on_one_kept_alive_connection():
    async def test(server: HttpServer) -> None:
        async with httpx.AsyncClient(base_url=f"http://{HOST}:{server.port}") as client:
            first = await client.post("/v1/x?a=1", content=b"hello", headers={"x-test": "yes"})
            second = await client.get("/v1/y%20z")
            assert len(server.connections) == 1
        assert first.status_code == 200 and "transfer-encoding" not in first.headers
        assert first.json() == {
            "method": "POST",
            "path": "/v1/x",
            "query": "a=1",
            "x_test": "yes",
            "client": [HOST, first.json()["client"][1]],
            "body_bytes": 5,
            "body_sum": sum(b"hello"),
        }
        assert second.json()["path"] == "/v1/y z" and second.json()["body_bytes"] == 0

    run(echo_app, test)


@settings(max_examples=20, deadline=None)
@given(sizes=st.lists(st.integers(min_value=0, max_value=300_000), min_size=1, max_size=4))
def test_request_bodies_sized_and_chunked_arrive_whole(sizes):
    """Bodies larger than the read buffer arrive whole (reading pauses while they wait), sized or chunked."""
    bodies = [bytes((i * 7 + n) % 251 for i in range(size)) for n, size in enumerate(sizes)]

    async def chunks(body: bytes):
        for start in range(0, len(body), 70_000):
            yield body[start : start + 70_000]

    async def test(server: HttpServer) -> None:
        async with httpx.AsyncClient(base_url=f"http://{HOST}:{server.port}") as client:
            for body in bodies:
                for content in (body, chunks(body)):
                    answer = (await client.post("/", content=content)).json()
                    assert (answer["body_bytes"], answer["body_sum"]) == (len(body), sum(body) % 65_521)

    run(echo_app, test)


def test_expect_continue_is_answered_before_the_body():
    async def test(server: HttpServer) -> None:
        reader, writer = await asyncio.open_connection(HOST, server.port)
        writer.write(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\nexpect: 100-continue\r\nconnection: close\r\n\r\n")
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"abc")
        response = await reader.read()
        writer.close()
        assert response.startswith(b"HTTP/1.1 200 OK\r\n") and json.loads(response.split(b"\r\n\r\n", 1)[1])["body_bytes"] == 3

    run(echo_app, test)


def test_pipelined_requests_are_answered_in_order():
    async def test(server: HttpServer) -> None:
        heads = b"".join(b"GET /%d HTTP/1.1\r\nhost: x\r\n\r\n" % i for i in range(3))
        response = await exchange(server.port, heads + b"GET /last HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        bodies = [json.loads(part.split(b"\r\n\r\n", 1)[1][: part.split(b"\r\n\r\n", 1)[1].index(b"}") + 1]) for part in response.split(b"HTTP/1.1 200 OK")[1:]]
        assert [body["path"] for body in bodies] == ["/0", "/1", "/2", "/last"]

    run(echo_app, test)


def frames_app(count: int):
    async def frames():
        for i in range(count):
            yield f"data: {i}\n\n"

    async def app(scope, receive, send) -> None:
        await Request(scope, receive).body()
        await EventStream(frames(), lambda: None)(scope, receive, send)

    return app


def test_streamed_response_is_chunked_and_ends():
    async def test(server: HttpServer) -> None:
        async with httpx.AsyncClient(base_url=f"http://{HOST}:{server.port}") as client:
            for _ in range(2):  # the connection is reused after a streamed response
                async with client.stream("POST", "/", content=b"{}") as response:
                    assert response.headers["transfer-encoding"] == "chunked"
                    assert response.headers["content-type"].startswith("text/event-stream")
                    text = "".join([chunk async for chunk in response.aiter_text()])
                assert text == "".join(f"data: {i}\n\n" for i in range(50))
            assert len(server.connections) == 1

    run(frames_app(50), test)


def test_a_client_that_leaves_is_seen_by_the_app():
    seen: list[str] = []

    async def app(scope, receive, send) -> None:
        await Request(scope, receive).body()
        gone = asyncio.Event()

        async def forever():
            i = 0
            while not gone.is_set():
                yield f"data: {i}\n\n"
                i += 1
                await asyncio.sleep(0.01)

        await EventStream(forever(), lambda: (seen.append("disconnect"), gone.set()))(scope, receive, send)

    async def test(server: HttpServer) -> None:
        reader, writer = await asyncio.open_connection(HOST, server.port)
        writer.write(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        await reader.readuntil(b"data: 3\n\n")
        writer.close()
        while not seen:
            await asyncio.sleep(0.01)
        while server.connections:
            await asyncio.sleep(0.01)

    run(app, test)
    assert seen == ["disconnect"]


@pytest.mark.parametrize(
    "head",
    [
        b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 70_000 + b"\r\n\r\n",
        b"GET / HTTP/1.1\r\n" + b"".join(b"x-%d: 1\r\n" % i for i in range(101)) + b"\r\n",
        b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n",
    ],
    ids=["long_header", "many_headers", "long_url"],
)
def test_a_head_past_the_limits_gets_431(head):
    async def test(server: HttpServer) -> None:
        response = await exchange(server.port, head)
        assert response.startswith(b"HTTP/1.1 431 ")
        assert (await httpx.AsyncClient().get(f"http://{HOST}:{server.port}/after")).json()["path"] == "/after"

    run(echo_app, test)


@pytest.mark.parametrize(
    "garbage",
    [b"NOT HTTP AT ALL\r\n\r\n", b"GET / HTTP/1.1\r\ncontent-length: x\r\n\r\n", b"GET / HTTP/1.1\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n"],
)
def test_a_malformed_request_gets_400_and_the_server_goes_on(garbage):
    async def test(server: HttpServer) -> None:
        assert (await exchange(server.port, garbage)).startswith(b"HTTP/1.1 400 ")
        assert (await httpx.AsyncClient().get(f"http://{HOST}:{server.port}/after")).status_code == 200

    run(echo_app, test)


@settings(max_examples=60, deadline=None)
@given(garbage=st.binary(max_size=2_000))
def test_any_bytes_leave_the_server_serving(garbage):
    async def test(server: HttpServer) -> None:
        reader, writer = await asyncio.open_connection(HOST, server.port)
        writer.write(garbage)
        writer.write_eof()
        await reader.read()
        writer.close()
        assert (await httpx.AsyncClient().get(f"http://{HOST}:{server.port}/after")).status_code == 200

    run(echo_app, test, ServerLimits(head_timeout_s=0.5))


def test_a_slow_head_is_cut_off():
    async def test(server: HttpServer) -> None:
        reader, writer = await asyncio.open_connection(HOST, server.port)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n")  # and nothing more
        started = asyncio.get_running_loop().time()
        assert await reader.read() == b""
        assert asyncio.get_running_loop().time() - started < 2.0
        writer.close()

    run(echo_app, test, ServerLimits(head_timeout_s=0.3))


def test_an_idle_kept_alive_connection_is_closed():
    async def test(server: HttpServer) -> None:
        reader, writer = await asyncio.open_connection(HOST, server.port)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        await reader.readuntil(b"}")
        assert await reader.read() == b""  # closed once idle for head_timeout_s
        writer.close()

    run(echo_app, test, ServerLimits(head_timeout_s=0.3))


def test_connections_past_the_limit_are_closed_at_once():
    async def test(server: HttpServer) -> None:
        kept = [await asyncio.open_connection(HOST, server.port) for _ in range(2)]
        await asyncio.sleep(0.1)
        reader, writer = await asyncio.open_connection(HOST, server.port)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        assert await reader.read() == b""
        for _, kept_writer in kept:
            kept_writer.close()

    run(echo_app, test, ServerLimits(max_connections=2))


def test_an_app_that_fails_gets_a_500():
    async def app(scope, receive, send) -> None:
        raise RuntimeError("boom")

    async def test(server: HttpServer) -> None:
        assert (await exchange(server.port, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")).startswith(b"HTTP/1.1 500 ")

    run(app, test)


def test_drain_lets_streams_finish_and_refuses_new_connections():
    opened = asyncio.Event()  # set once a new connection was refused

    async def test(server: HttpServer) -> None:
        reader, writer = await asyncio.open_connection(HOST, server.port)
        writer.write(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        await reader.readuntil(b"data: 0\n\n")
        drain = asyncio.get_running_loop().create_task(server.drain(WAIT_S))
        await asyncio.sleep(0.1)
        with pytest.raises(OSError):
            await asyncio.open_connection(HOST, server.port)
        opened.set()
        rest = await reader.read()
        assert rest.endswith(b"data: 9\n\n\r\n0\r\n\r\n")
        await drain
        writer.close()

    async def app(scope, receive, send) -> None:
        async def frames():
            yield "data: 0\n\n"
            await opened.wait()
            for i in range(1, 10):
                yield f"data: {i}\n\n"

        await EventStream(frames(), lambda: None)(scope, receive, send)

    run(app, test)


def test_two_servers_share_a_port():
    async def main() -> None:
        first = HttpServer(echo_app)
        await first.start(HOST, 0)
        second = HttpServer(echo_app)
        await second.start(HOST, first.port)
        try:
            async with httpx.AsyncClient() as client:
                for _ in range(8):
                    assert (await client.get(f"http://{HOST}:{first.port}/", headers={"connection": "close"})).status_code == 200
        finally:
            await first.drain(0)
            await second.drain(0)

    asyncio.run(main())


def test_a_port_another_process_listens_on_is_named_before_the_replica_shares_it():
    """HAProxy sets SO_REUSEPORT too: sharing its port would split the connections silently."""
    from deployments.replica_front import check_port

    holder = listening_socket(HOST, 0)  # a free port, held below by a child: the check skips its own process
    port = holder.getsockname()[1]
    holder.close()
    child = subprocess.Popen([sys.executable, "-c", HOLD_PORT.format(port=port)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "listening"
        with pytest.raises(OSError, match=f"port {port} is held by pid {child.pid}"):
            check_port(port, "spout")
    finally:
        child.kill()
        child.wait()
    check_port(port, "spout")  # free again: nothing to say


HOLD_PORT = """
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1); s.bind(("127.0.0.1", {port})); s.listen()
print("listening", flush=True); time.sleep(60)
"""


def test_a_second_socket_shares_the_connections_and_in_flight_counts_what_is_answered_or_queued():
    """The replica's own port beside the shared one: both serve the app; a request being answered and one
    pipelined behind it both count as in flight, until they end."""
    release = asyncio.Event()

    async def held_app(scope, receive, send) -> None:
        if scope["path"] == "/hold":
            await release.wait()
        await JSONResponse({"path": scope["path"]})(scope, receive, send)

    async def test(server: HttpServer) -> None:
        await server.serve(listening_socket(HOST, 0))
        own_port = server.servers[1].sockets[0].getsockname()[1]
        assert own_port != server.port
        async with httpx.AsyncClient(base_url=f"http://{HOST}:{own_port}") as client:
            assert (await client.get("/own")).json() == {"path": "/own"}
        assert server.requests_in_flight() == 0
        reader, writer = await asyncio.open_connection(HOST, own_port)
        writer.write(b"GET /hold HTTP/1.1\r\nhost: x\r\n\r\nGET /next HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        while server.requests_in_flight() < 2:
            await asyncio.sleep(0.01)
        release.set()
        answers = await reader.read()
        writer.close()
        assert answers.count(b"HTTP/1.1 200 ") == 2 and b'"/next"' in answers
        while server.requests_in_flight():
            await asyncio.sleep(0.01)
        server.stop_accepting()
        with pytest.raises(OSError):
            await asyncio.open_connection(HOST, own_port)

    run(held_app, test)
