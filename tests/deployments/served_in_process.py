"""The ingress's whole serving path in one process, without Serve or Ray: `Ingress` instances with the
real `EngineClient`, output router and inline detokenizer, in front of one real engine (the
`EngineActor`'s body, its engine thread stepping the model), reached through the ``openai`` and
``anthropic`` SDKs over an in-process ASGI transport.

Everything async runs on one event loop in a thread of its own (the engine actor binds to the loop of
its first call); a test hands it a coroutine with `InProcessServer.run`, which bounds the wait.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import anthropic
import httpx
import httpx2
import openai
from starlette.requests import Request

from deployments.detok_pool import DetokClient
from deployments.engine_actor import EngineActor
from deployments.engine_client import EngineClient
from deployments.ingress import Ingress
from engine.config import EngineConfig
from engine.loader.model_files import load_tokenizer
from tests.deployments.in_process import attach, replica

T = TypeVar("T")
WAIT_S = 120.0


class LocalMethod:
    """``handle.method.remote(...)`` as Ray's handle spells it, called in-process: the coroutine to await."""

    def __init__(self, method: Any) -> None:
        self.remote = method


class LocalEngineHandle:
    """An `EngineActor` behind the handle its callers use (`deployments.engine_actor.EngineHandle`)."""

    def __init__(self, actor: EngineActor) -> None:
        self.actor = actor

    def __getattr__(self, name: str) -> LocalMethod:
        return LocalMethod(getattr(self.actor, name))


class InProcessServer:
    """One engine serving ``model``; `ingress` builds a replica with the given server options in front of it."""

    def __init__(self, model: str, max_model_len: int = 256, max_num_seqs: int = 8) -> None:
        self.model = model
        self.max_model_len = max_model_len
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="in-process-server", daemon=True)
        self.thread.start()
        config = EngineConfig(model=model, max_num_seqs=max_num_seqs, max_model_len=max_model_len)
        self.actor = self.run(self._start(config))
        self.tokenizer = load_tokenizer(model)

    async def _start(self, config: EngineConfig) -> EngineActor:
        actor = await asyncio.to_thread(EngineActor, config, 64)
        await actor.ready()
        return actor

    def run(self, work: Coroutine[Any, Any, T], timeout_s: float = WAIT_S) -> T:
        """``work`` run on the server's loop; its result, or a timeout after ``timeout_s``."""
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(timeout_s)

    def close(self) -> None:
        """Stop the engine thread, then the tasks left on the loop (the replicas' output loops), then the loop."""
        self.run(self.actor.shutdown())
        self.run(self._cancel_tasks())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT_S)

    async def _cancel_tasks(self) -> None:
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def ingress(self, **options: object) -> Ingress:
        """An ingress replica with ``options`` (`ServeArgs`), as `Ingress.__init__` builds it, less Serve."""
        return self.run(self._ingress(options))

    async def _ingress(self, options: dict[str, object]) -> Ingress:
        made = replica(self.model, self.max_model_len, tokenizer=self.tokenizer, **options)
        args = made.args
        detok = DetokClient(made.tokenizer.tokenizer, None, args.inline_detok_threshold, args.detok_tokens_per_call)
        engines = [LocalEngineHandle(self.actor)]
        client = EngineClient(
            engines, f"subscriber-{id(made)}", made.encoder, detok, made.metrics, args.stream_interval, args.stream_idle_timeout_s, args.engine_routing_rules()
        )  # type: ignore[arg-type]
        return attach(made, client)


def asgi(ingress: Ingress):
    """The replica as an ASGI app, as its own HTTP server serves it."""

    async def app(scope: dict, receive: Any, send: Any) -> None:
        response = await ingress(Request(scope, receive))
        await response(scope, receive, send)

    return app


def openai_client(ingress: Ingress) -> openai.AsyncOpenAI:
    """The ``openai`` SDK talking to ``ingress`` in-process (on the server's loop)."""
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi(ingress)), base_url="http://spout.test")
    return openai.AsyncOpenAI(base_url="http://spout.test/v1", api_key="unused", http_client=http, max_retries=0, timeout=WAIT_S)


def anthropic_client(ingress: Ingress) -> anthropic.AsyncAnthropic:
    """The ``anthropic`` SDK talking to ``ingress`` in-process (on the server's loop; that SDK is built on ``httpx2``)."""
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=asgi(ingress)), base_url="http://spout.test")
    return anthropic.AsyncAnthropic(base_url="http://spout.test", api_key="unused", http_client=http, max_retries=0, timeout=WAIT_S)
