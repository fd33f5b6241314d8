"""The load generators of `bench.serve_load`: many concurrent streaming completions on loopback.

Two clients (`CLIENTS`): ``raw``, a plain asyncio HTTP/1.1 client (one connection per
stream, chunked or sized bodies, SSE events split on blank lines), so the load generator
costs little of the CPU it shares with the server; and ``httpx``, an ordinary client: one
``httpx.AsyncClient`` with its connection pool, reading each SSE line as the ``openai`` SDK
does. Tokens are counted from the final usage chunk, so frames that carry several tokens
count them all.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

import httpx

SSE_DATA = b"data: "
CLIENTS = ("raw", "httpx")
logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise, under Ray's logging setup


@dataclass
class StreamResult:
    """One stream as the client saw it; ``gaps_s`` are the waits between frames that carried text,
    ``done`` whether ``data: [DONE]`` came, ``error`` what failed it (an error frame's message, a
    transport error), if anything did."""

    text: str = ""
    tokens: int = 0
    frames: int = 0
    ttft_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)
    failed: bool = False
    done: bool = False
    error: str = ""


def completion_body(model: str, index: int, max_tokens: int, stream: bool) -> dict:
    """Greedy with ``ignore_eos``, so every stream has ``max_tokens`` tokens and one exact
    expected text (its non-streaming twin); tiny-random's greedy continuations differ per prompt."""
    body = {
        "model": model,
        "prompt": f"Request {index}: tell me something.",
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes]]:
    status = int((await reader.readline()).split(b" ", 2)[1])
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip().lower()
    return status, headers


async def _body_pieces(reader: asyncio.StreamReader, headers: dict[bytes, bytes]):
    """The response body as it arrives: de-chunked, sized, or up to EOF."""
    if headers.get(b"transfer-encoding") == b"chunked":
        while size := int((await reader.readline()).split(b";")[0], 16):
            yield await reader.readexactly(size)
            await reader.readexactly(2)
    elif b"content-length" in headers:
        yield await reader.readexactly(int(headers[b"content-length"]))
    else:
        while piece := await reader.read(65536):
            yield piece


def _request_bytes(host: str, port: int, path: str, body: dict) -> bytes:
    payload = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    return head.encode() + payload


def _on_event(result: StreamResult, event: bytes, started: float, last: float) -> float:
    """Fold one SSE event into ``result``; returns the time of the last frame with text."""
    if not event.startswith(SSE_DATA) or event[6:7] != b"{":
        return last
    return _on_chunk(result, json.loads(event[6:]), started, last)


def _on_chunk(result: StreamResult, chunk: dict, started: float, last: float) -> float:
    """Fold one parsed SSE chunk into ``result``; returns the time of the last frame with text."""
    if "error" in chunk:
        result.failed = True
        result.error = str(chunk["error"].get("message", chunk["error"]) if isinstance(chunk["error"], dict) else chunk["error"])
        return last
    if chunk.get("usage"):
        result.tokens = chunk["usage"]["completion_tokens"]
    text = "".join(choice["text"] for choice in chunk["choices"])
    if not text:
        return last
    now = time.perf_counter()
    result.frames += 1
    if result.ttft_s is None:
        result.ttft_s = now - started
    else:
        result.gaps_s.append(now - last)
    result.text += text
    return now


async def stream_one(host: str, port: int, body: dict) -> StreamResult:
    """POST ``body`` to /v1/completions and read its SSE stream to the end."""
    result = StreamResult()
    started = last = time.perf_counter()
    writer = None
    try:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
        writer.write(_request_bytes(host, port, "/v1/completions", body))
        status, headers = await _read_head(reader)
        buffer = b""
        async for piece in _body_pieces(reader, headers):
            buffer += piece
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                last = _on_event(result, event, started, last)
        result.failed = result.failed or status != 200 or result.tokens == 0
    except (OSError, ValueError, asyncio.IncompleteReadError):
        result.failed = True
    finally:
        if writer is not None:
            writer.close()
    return result


async def stream_one_httpx(client: httpx.AsyncClient, body: dict) -> StreamResult:
    """POST ``body`` to /v1/completions and read its SSE stream line by line, as the ``openai`` SDK does."""
    result = StreamResult()
    started = last = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    last = _on_chunk(result, json.loads(line[6:]), started, last)
                elif line == "data: [DONE]":
                    result.done = True
        result.failed = result.failed or response.status_code != 200 or result.tokens == 0
        if response.status_code != 200 and not result.error:
            result.error = f"HTTP {response.status_code}"
    except (httpx.HTTPError, ValueError) as error:
        result.failed = True
        result.error = f"{type(error).__name__}: {error}"
    return result


async def post_json(host: str, port: int, body: dict) -> dict | None:
    """A non-streaming POST to /v1/completions; the parsed body, or None if it failed."""
    writer = None
    try:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
        writer.write(_request_bytes(host, port, "/v1/completions", body))
        status, headers = await _read_head(reader)
        payload = b"".join([piece async for piece in _body_pieces(reader, headers)])
        return json.loads(payload) if status == 200 else None
    except (OSError, ValueError, asyncio.IncompleteReadError):
        return None
    finally:
        if writer is not None:
            writer.close()


async def run_streams(host: str, port: int, bodies: list[dict], timeout_s: float, client: str = "raw") -> tuple[list[StreamResult], float]:
    """Every stream at once with ``client`` (one of `CLIENTS`); their results and the wall time they took."""
    if client == "httpx":
        limits = httpx.Limits(max_connections=len(bodies), max_keepalive_connections=len(bodies))
        async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=timeout_s, limits=limits) as pool:
            started = time.perf_counter()
            results = await asyncio.wait_for(asyncio.gather(*(stream_one_httpx(pool, b) for b in bodies)), timeout_s)
    else:
        started = time.perf_counter()
        results = await asyncio.wait_for(asyncio.gather(*(stream_one(host, port, b) for b in bodies)), timeout_s)
    return list(results), time.perf_counter() - started


async def reference_texts(host: str, port: int, bodies: list[dict], batch: int, timeout_s: float) -> list[str | None]:
    """The non-streaming texts the streams must equal, ``batch`` requests at a time."""
    texts: list[str | None] = []
    for start in range(0, len(bodies), batch):
        parts = bodies[start : start + batch]
        responses = await asyncio.wait_for(asyncio.gather(*(post_json(host, port, b) for b in parts)), timeout_s)
        texts += [r["choices"][0]["text"] if r else None for r in responses]
    return texts


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency_fields(results: list[StreamResult], references: list[str | None], elapsed_s: float) -> dict[str, float | int]:
    """The row fields the client measures: TTFT and inter-frame gaps (ms), tokens/s, failures."""
    ttfts = [r.ttft_s for r in results if r.ttft_s is not None]
    gaps = [g for r in results for g in r.gaps_s]
    tokens = sum(r.tokens for r in results)
    frames = sum(r.frames for r in results)
    return {
        "ttft_p50_ms": round(percentile(ttfts, 0.5) * 1e3, 1),
        "ttft_p99_ms": round(percentile(ttfts, 0.99) * 1e3, 1),
        "itl_p50_ms": round(percentile(gaps, 0.5) * 1e3, 2),
        "itl_p99_ms": round(percentile(gaps, 0.99) * 1e3, 2),
        "output_tokens_per_s": round(tokens / elapsed_s, 1),
        "tokens_per_frame": round(tokens / max(frames, 1), 2),
        "failed_streams": sum(r.failed for r in results),
        "wrong_streams": sum(not r.failed and r.text != ref for r, ref in zip(results, references)),
    }
