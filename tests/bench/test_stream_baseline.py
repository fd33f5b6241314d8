"""The per-request-streaming baseline of `bench.serve_load`, in-process (no Ray): its frames
carry the same text as the engine's own output, so the benchmark compares like with like."""

from __future__ import annotations

import asyncio
import json

from bench.lib.stream_baseline import EngineServer
from deployments.openai.responses import ResponseFormat
from engine.config import EngineConfig
from engine.core import EngineCore
from sampling.params import SamplingParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def engine_text(prompt: list[int]) -> str:
    engine = EngineCore(EngineConfig(model="tiny-random", max_num_seqs=1, max_model_len=64))
    engine.add_request("reference", prompt, PARAMS)
    token_ids: list[int] = []
    while engine.has_unfinished_requests():
        token_ids += [t for output in engine.step() for t in output.new_token_ids]
    return engine.tokenizer.decode(token_ids)


def test_baseline_streams_the_engines_text_then_usage():
    async def run() -> list[str]:
        server = EngineServer("tiny-random", max_num_seqs=2, max_model_len=64, batch_interval_ms=0)
        try:
            fmt = ResponseFormat.new("cmpl-test", "tiny-random", chat=False)
            return [frame async for frames in server.generate(fmt, prompt, PARAMS) for frame in frames]
        finally:
            server.dispatcher.cancel()
            await server.engine.shutdown()

    prompt = [100, 200, 300]
    frames = asyncio.run(asyncio.wait_for(run(), timeout=120))
    chunks = [json.loads(frame.removeprefix("data: ")) for frame in frames]
    assert len(chunks) == PARAMS.max_tokens + 1  # one frame per token, then usage
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == engine_text(prompt)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == PARAMS.max_tokens
