"""Floors under the ingress's CPU per streamed token, without Ray: the HTTP server's, and Spout's own code's.

``python -m bench.egress_floor [--quick]`` measures, at 256 concurrent streams of 64 frames:

- ``uvicorn_streaming_response``: a bare uvicorn server (httptools, uvloop, as Serve's
  direct ingress runs it) in a child process, whose app wakes every stream once per
  simulated 30 ms step and sends one frame of the ingress's size through Starlette's
  ``StreamingResponse``; its CPU per frame, read from /proc. The reference.
- ``uvicorn_event_stream``: the same server with Spout's `EventStream` instead.
- ``replica_server_event_stream``: the same app (`EventStream`) on Spout's own HTTP server
  (`deployments.http_server`, what ``http_front=replica`` serves with) instead of uvicorn.
- ``raw_task`` and ``raw_step``: the same frames from a bare asyncio protocol
  (`bench.lib.raw_sse_server`), no ASGI: a task per stream woken each step, or every stream's frame
  written from the step's own loop. The floor of the write itself, and what a task wake per frame adds.
- ``spout_code``: the ingress's own per-token path in-process, with neither HTTP nor
  Ray: each step's `EngineOutput`s polled over a real engine channel on loopback (both of its
  ends in this process), `OutputRouter._route` on them (inline detok, stop and delivery),
  then each stream's `EngineClient.stream` through `EventStream` to a send that does
  nothing; CPU per token of this process.
- ``spout_code_direct``: the same with a server that offers its body writer (as Spout's own
  does, ``http_front=replica``): each frame is written from the router's loop, no task woken.

Each measured process freezes its start-up heap first (`deployments.startup_heap`), as Serve's
replicas and vLLM's API server do: else a full collection of torch's objects lands in a window now
and then, 6 µs a frame or more. What the ingress costs above the sum (``bench.serve_load``'s ``cpu_us_ingress``, one
frame per token) is Serve's and Ray's: per-request handling, the ASGI wrappers around
each send, and receiving the engine's messages. Rows go to bench/results/egress_floor.json.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import time
from collections.abc import Awaitable

import uvicorn
import uvloop
from starlette.responses import StreamingResponse

from bench.lib.common import print_table, quietness, write_results
from bench.lib.load_client import run_streams
from bench.lib.process_cpu import TICKS_PER_S
from bench.lib.raw_sse_server import Streams, serve_forever
from bench.lib.serve_cluster import free_port
from deployments.detok_pool import DetokClient
from deployments.engine_actor import Polled
from deployments.engine_channel import ChannelAddress, ChannelServer, EngineMethod
from deployments.engine_client import EngineClient, OutputTally, Submission
from deployments.http_server import HttpServer
from deployments.metrics import IngressMetrics
from deployments.openai.event_stream import BODY_WRITER, EventStream
from deployments.openai.protocol import StreamUsage
from deployments.openai.responses import ResponseFormat, sse
from deployments.prompt_encoder import PromptEncoder
from deployments.startup_heap import freeze_startup_heap
from deployments.streams import ChoiceStream, Mailbox
from detok import initial_state
from engine.loader.model_files import load_tokenizer
from engine.outputs import EngineOutput, FinishReason
from sampling.params import SamplingParams

HOST = "127.0.0.1"
STEP_S = 0.03
FORMAT = ResponseFormat("cmpl-0123456789abcdef0123456789abcdef", "tiny-random", chat=False, created=1763772000)
FRAME = FORMAT.chunk_frame([FORMAT.chunk_choice(0, " word", None, None)])
LAST_FRAME = FORMAT.chunk_frame([FORMAT.chunk_choice(0, " word", "length", None)]) + sse(FORMAT.usage_chunk({"completion_tokens": 0}))


def bare_app(response: str, frames: int):
    """An ASGI app streaming ``frames`` frames per request, one per step to every stream."""
    wakeups: set[asyncio.Event] = set()
    tickers: list[asyncio.Task[None]] = []

    async def ticker() -> None:
        while True:
            await asyncio.sleep(STEP_S)
            for wakeup in list(wakeups):
                wakeup.set()

    async def body(wakeup: asyncio.Event):
        try:
            for i in range(frames):
                await wakeup.wait()
                wakeup.clear()
                yield FRAME if i < frames - 1 else LAST_FRAME.replace('"completion_tokens":0', f'"completion_tokens":{frames}')
            yield "data: [DONE]\n\n"
        finally:
            wakeups.discard(wakeup)

    async def app(scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await receive()
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if not tickers:  # the first request starts the steps
            tickers.append(asyncio.get_running_loop().create_task(ticker()))
        while (await receive()).get("more_body"):
            pass
        wakeup = asyncio.Event()
        wakeups.add(wakeup)
        frames_out = body(wakeup)
        if response == "streaming_response":
            await StreamingResponse(frames_out, media_type="text/event-stream")(scope, receive, send)
        else:
            await EventStream(frames_out, lambda: None)(scope, receive, send)

    return app


def _serve(port: int, server: str, response: str, frames: int) -> None:
    app = bare_app(response, frames)
    freeze_startup_heap()  # as Serve does for a replica, and vLLM for its API server
    if server == "raw":
        last = LAST_FRAME.replace('"completion_tokens":0', f'"completion_tokens":{frames}') + "data: [DONE]\n\n"
        serve_forever(HOST, port, Streams(response, FRAME.encode(), last.encode(), frames), STEP_S)
        return
    if server == "uvicorn":
        uvicorn.run(app, host=HOST, port=port, log_level="warning", loop="uvloop", http="httptools")
        return
    uvloop.install()

    async def serve() -> None:
        await HttpServer(app).start(HOST, port)
        await asyncio.Event().wait()

    asyncio.run(serve())


def process_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def measure_server(server_kind: str, response: str, streams: int, frames: int) -> dict:
    """``server_kind`` (``uvicorn``, ``replica_server``: `bare_app` as ``response``; ``raw``: `bench.lib.raw_sse_server`
    in the ``response`` mode) in a child process: its CPU per frame."""
    port = free_port()
    server = multiprocessing.get_context("spawn").Process(target=_serve, args=(port, server_kind, response, frames), daemon=True)
    server.start()
    try:
        body = {"model": "tiny-random", "prompt": "hi"}
        deadline = time.monotonic() + 60
        while not any(not r.failed for r in asyncio.run(run_streams(HOST, port, [body] * 4, 60))[0]):  # up and warm
            if time.monotonic() > deadline:
                raise RuntimeError(f"the bare {server_kind} server did not answer")
            time.sleep(0.5)
        before = process_cpu_s(server.pid)
        results, _ = asyncio.run(run_streams(HOST, port, [body] * streams, 300))
        cpu_s = process_cpu_s(server.pid) - before
    finally:
        server.kill()
    sent = sum(r.frames for r in results)
    return {
        "path": f"{server_kind}_{response}",
        "streams": streams,
        "units": sent,
        "failed_streams": sum(r.failed for r in results),
        "cpu_us_per_unit": round(cpu_s / max(sent, 1) * 1e6, 1),
    }


class _ScriptedEngine:
    """An engine handle whose long poll (over a real engine channel on loopback) returns one prepared
    step per call, once the streams have written the previous step's frames; then it never returns."""

    def __init__(self, steps: list[list[EngineOutput]]) -> None:
        self.channel_address = self
        self.channel = ChannelServer({EngineMethod.GET_OUTPUTS: self._poll}, "127.0.0.1")
        self.steps = iter(steps)
        self.done = asyncio.Event()

    def remote(self) -> Awaitable[ChannelAddress]:
        """``channel_address.remote()``: where the router polls."""
        return self.channel.address()

    async def _poll(self, *args: object) -> Polled:
        for _ in range(3):  # let every stream write its frame, as between two engine messages
            await asyncio.sleep(0)
        outputs = next(self.steps, None)
        if outputs is None:
            self.done.set()
            await asyncio.Event().wait()
        return Polled(0, outputs)


class _CountingBody:
    """A `deployments.openai.event_stream.BodyWriter` that counts the chunks written to it."""

    def __init__(self) -> None:
        self.chunks = 0

    def can_write_now(self) -> bool:
        return True

    def write_now(self, body: bytes) -> None:
        self.chunks += 1


async def _spout_code(streams: int, frames: int, direct: bool) -> dict:
    tokenizer = load_tokenizer("tiny-random")
    prompt = tokenizer.encode("Request 1: tell me something.")
    token_ids = tokenizer.encode(" the quick brown fox jumps over the lazy dog")
    finish = [None] * (frames - 1) + [FinishReason.LENGTH]
    engine = _ScriptedEngine(
        [[EngineOutput(f"r{i}", [token_ids[step % len(token_ids)]], len(prompt), finish[step]) for i in range(streams)] for step in range(frames)]
    )
    detok = DetokClient(tokenizer.tokenizer, None, inline_threshold=1 << 30, tokens_per_call=1 << 30)
    params = SamplingParams(temperature=0.0, max_tokens=frames, ignore_eos=True)
    sent = 0

    async def send(message: dict) -> None:
        nonlocal sent
        sent += message["type"] == "http.response.body"

    async def never() -> dict:
        await asyncio.Event().wait()
        return {}

    freeze_startup_heap()  # as Serve does for a replica once it has started
    started = time.process_time()
    client = EngineClient([engine], "bench", PromptEncoder(tokenizer), detok, IngressMetrics("tiny-random", "bench"))  # its router starts polling at once
    body = _CountingBody()
    scope = {"type": "http", "extensions": {BODY_WRITER: {"writer": body}} if direct else {}}
    responses = []
    for i in range(streams):
        mailbox = Mailbox()
        stream = ChoiceStream(f"r{i}", 0, 0, mailbox, initial_state(tokenizer.tokenizer, prompt, params))
        client.router.register(stream)
        submission = Submission(FORMAT, [stream], mailbox, len(prompt), [""], OutputTally(1, time.perf_counter(), client.metrics, None))
        responses.append(asyncio.create_task(client.stream(submission, StreamUsage(final=True, continuous=False))(scope, never, send)))
    await asyncio.wait_for(asyncio.gather(*responses), 300)
    cpu_s = time.process_time() - started
    tokens = streams * frames
    assert sent + body.chunks == tokens, (sent, body.chunks)  # a write per token, the last with the usage, [DONE] and the body's end
    path = "spout_code_direct" if direct else "spout_code"
    return {"path": path, "streams": streams, "units": tokens, "failed_streams": 0, "cpu_us_per_unit": round(cpu_s / tokens * 1e6, 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="16 frames per stream instead of 64")
    args = parser.parse_args(argv)
    streams, frames = 256, 16 if args.quick else 64
    load_before = os.getloadavg()[0]
    servers = [("uvicorn", "streaming_response"), ("uvicorn", "event_stream"), ("replica_server", "event_stream"), ("raw", "task"), ("raw", "step")]
    rows = [measure_server(server, response, streams, frames) for server, response in servers]
    rows += [asyncio.run(_spout_code(streams, frames, direct)) for direct in (False, True)]
    print_table(rows)
    print(f"wrote {write_results('egress_floor', rows, quick=args.quick, **quietness(load_before))}")


if __name__ == "__main__":
    main()
