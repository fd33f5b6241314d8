"""The replica's own HTTP server writing bodies beside ASGI's ``send``: chunks written through the body
writer (`deployments.openai.event_stream.BODY_WRITER`) and through ``send`` interleave in order under
back-pressure, a turn's chunks go out together and before a later ``send``, and a client whose socket
takes nothing for ``write_timeout_s`` is cut off."""

from __future__ import annotations

import asyncio
import socket

from starlette.requests import Request

from deployments.http_server import HttpServer, ServerLimits
from deployments.openai.event_stream import BODY_WRITER, EventStream
from tests.deployments.http_serving import HOST, exchange, run


def test_body_chunks_written_directly_and_sent_interleave_in_order_under_back_pressure():
    """The app writes each chunk at once while the body writer can, else through ``send`` (which waits for
    the client): a client that reads nothing for a while fills the socket, so both ways are taken,
    and it still reads every chunk once, in order."""
    count, chunk = 200, "x" * 1000
    ways = {"direct": 0, "send": 0}

    async def app(scope, receive, send) -> None:
        await Request(scope, receive).body()
        writer = scope["extensions"][BODY_WRITER]["writer"]
        assert not writer.can_write_now()  # no head yet
        transport = writer.connection.transport  # small buffers on both ends, so that the client's socket fills soon
        transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        transport.set_write_buffer_limits(high=4096)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for i in range(count):
            frame = f"data: {i} {chunk}\n\n".encode()
            if writer.can_write_now():
                ways["direct"] += 1
                writer.write_now(frame)
                await asyncio.sleep(0)  # the turn ends, as the router's step does: the queued chunk goes out
            else:
                ways["send"] += 1
                await send({"type": "http.response.body", "body": frame, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        assert not writer.can_write_now()  # the response is over

    async def test(server: HttpServer) -> None:
        reader, writer = await asyncio.open_connection(HOST, server.port)
        writer.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        writer.write(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        await asyncio.sleep(0.3)  # the socket fills meanwhile
        raw = await reader.read()
        writer.close()
        body = raw.split(b"\r\n\r\n", 1)[1]
        frames = decode_chunked(body).decode().split("\n\n")
        assert frames == [f"data: {i} {chunk}" for i in range(count)] + [""]

    run(app, test)
    assert ways["direct"] > 0 and ways["send"] > 0, ways


def test_chunks_written_directly_in_one_turn_go_out_together_and_before_a_later_send():
    sent_at: list[int] = []

    async def app(scope, receive, send) -> None:
        await Request(scope, receive).body()
        writer = scope["extensions"][BODY_WRITER]["writer"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"head,", "more_body": True})
        server = writer.connection.server
        for part in (b"a,", b"b,", b"c,"):
            writer.write_now(part)
        sent_at.append(len(server.queued_writes))  # queued, not sent yet
        await send({"type": "http.response.body", "body": b"end", "more_body": False})  # goes after them

    async def test(server: HttpServer) -> None:
        raw = await exchange(server.port, b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        assert decode_chunked(raw.split(b"\r\n\r\n", 1)[1]) == b"head,a,b,c,end"

    run(app, test)
    assert sent_at == [3]


def test_a_client_that_stops_reading_is_cut_off_after_the_write_timeout():
    seen: list[float] = []

    async def app(scope, receive, send) -> None:
        await Request(scope, receive).body()
        gone = asyncio.Event()
        started = asyncio.get_running_loop().time()

        async def endless():
            while not gone.is_set():
                yield "data: " + "x" * 8192 + "\n\n"

        def left() -> None:
            seen.append(asyncio.get_running_loop().time() - started)
            gone.set()

        await EventStream(endless(), left)(scope, receive, send)

    async def test(server: HttpServer) -> None:
        loop = asyncio.get_running_loop()
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            await loop.sock_connect(sock, (HOST, server.port))
            await loop.sock_sendall(sock, b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
            while not seen:  # the client reads nothing
                await asyncio.sleep(0.05)
        while server.connections:
            await asyncio.sleep(0.05)

    run(app, test, ServerLimits(write_timeout_s=0.5))
    assert len(seen) == 1 and 0.4 < seen[0] < 5, seen


def decode_chunked(body: bytes) -> bytes:
    """A chunked body's data (the test's own reading, not the server's code)."""
    data, rest = b"", body
    while True:
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            return data
        data, rest = data + rest[:size], rest[size + 2 :]
