"""The per-request-streaming reference of `bench.serve_load`: how Ray Serve LLM streams, on our engine.

Per HTTP request, `BaselineIngress` makes one Serve streaming handle call
(``handle.options(stream=True)``) to `EngineServer`, the deployment that holds the
engine, which yields that request's SSE frames as they come: one per engine output,
that is one per token. ``batch_interval_ms`` > 0 instead batches each request's frames
with the `Batcher` Ray Serve LLM itself uses (its default ``stream_batching_interval_ms``
is 50). The engine, the model and the detokenizer library are the product's:
`EngineActor` run in-process, and `detok` applied to each request on its own, as
vLLM's output processor does. A reference for the benchmark, not product code.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

from ray import serve
from ray.llm._internal.serve.utils.batcher import Batcher  # Ray Serve LLM's own stream batching
from ray.serve import Application
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import StreamingResponse

from deployments.engine_actor import EngineActor, NewRequest
from deployments.openai.protocol import CompletionRequest
from deployments.openai.responses import DONE_FRAME, ResponseFormat, sse, usage
from detok import DetokItem, detokenize_batch, initial_state
from engine.config import EngineConfig
from engine.loader.model_files import load_tokenizer
from engine.outputs import EngineOutput
from sampling.params import SamplingParams

SUBSCRIBER = "baseline"
UNBOUNDED = 100_000
"""max_ongoing_requests of both deployments, so Serve queues nothing (as Ray Serve LLM configures it)."""


class EngineServer:
    """Holds the engine; `generate` is one request's stream of SSE frames, in lists of one
    (or of ``batch_interval_ms`` worth of frames)."""

    def __init__(self, model: str, max_num_seqs: int, max_model_len: int, batch_interval_ms: float) -> None:
        self.engine = EngineActor(EngineConfig(model=model, max_num_seqs=max_num_seqs, max_model_len=max_model_len), UNBOUNDED)
        self.tokenizer = load_tokenizer(model).tokenizer
        self.batch_interval_ms = batch_interval_ms
        self.queues: dict[str, asyncio.Queue[EngineOutput]] = {}
        self.dispatcher: asyncio.Task | None = None

    async def _dispatch(self) -> None:
        """The engine's outputs to each request's queue (vLLM's AsyncLLM output handler)."""
        while True:
            for output in (await self.engine.get_outputs(SUBSCRIBER, 1.0, [])).outputs:
                queue = self.queues.get(output.request_id)
                if queue is not None:
                    queue.put_nowait(output)

    async def generate(self, fmt: ResponseFormat, prompt: list[int], params: SamplingParams) -> AsyncIterator[list[str]]:
        async for frames in Batcher(self._frames(fmt, prompt, params), interval_ms=self.batch_interval_ms).stream():
            yield frames

    async def _frames(self, fmt: ResponseFormat, prompt: list[int], params: SamplingParams) -> AsyncIterator[str]:
        if self.dispatcher is None:
            await self.engine.ready()
            self.dispatcher = asyncio.get_running_loop().create_task(self._dispatch())
        request_id = fmt.request_id
        queue = self.queues[request_id] = asyncio.Queue()
        state = initial_state(self.tokenizer, prompt, params)
        finished, num_tokens = False, 0
        try:
            [refusal] = (await self.engine.add_requests(SUBSCRIBER, [NewRequest(request_id, prompt, params)])).errors
            if refusal is not None:
                raise RuntimeError(refusal.message)
            while not finished:
                output = await queue.get()
                finished = output.finish_reason is not None
                [result] = detokenize_batch(self.tokenizer, [DetokItem(state, output.new_token_ids, finished)])
                state, num_tokens = result.state, num_tokens + len(output.new_token_ids)
                reason = output.finish_reason.value if finished else None
                yield sse(fmt.chunk([fmt.chunk_choice(0, result.text, reason, output.stop_reason)]))
            yield sse(fmt.usage_chunk(usage(len(prompt), num_tokens)))
        finally:
            del self.queues[request_id]
            if not finished:
                await self.engine.abort_requests([request_id])


class BaselineIngress:
    """Streaming completions only: parse, tokenize, one streaming handle call, forward its frames."""

    def __init__(self, server: DeploymentHandle[EngineServer], model: str) -> None:
        self.server = server
        self.model = model
        self.tokenizer = load_tokenizer(model)

    async def __call__(self, request: Request) -> StreamingResponse:
        body = CompletionRequest.model_validate(await request.json())
        prompt = self.tokenizer.encode(body.prompt)  # type: ignore[arg-type]
        fmt = ResponseFormat.new(f"cmpl-{uuid.uuid4().hex}", self.model, chat=False)
        frames = self.server.options(stream=True).generate.remote(fmt, prompt, body.sampling_params())
        return StreamingResponse(self._forward(frames), media_type="text/event-stream")

    async def _forward(self, frames: AsyncIterator[list[str]]) -> AsyncIterator[str]:
        async for batch in frames:
            yield "".join(batch)
        yield DONE_FRAME


def build_baseline(model: str, max_num_seqs: int, max_model_len: int, batch_interval_ms: float = 0) -> Application:
    server = serve.deployment(EngineServer, max_ongoing_requests=UNBOUNDED, ray_actor_options={"num_cpus": 1}).bind(
        model, max_num_seqs, max_model_len, batch_interval_ms
    )
    ingress = serve.deployment(BaselineIngress, max_ongoing_requests=UNBOUNDED, ray_actor_options={"num_cpus": 0})
    return ingress.bind(server, model)
