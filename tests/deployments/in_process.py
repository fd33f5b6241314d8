"""An `Ingress` in-process, without Serve or engines: the replica's own request path (auth, parsing,
limits, the `tiny-random` tokenizer and encode workers) in front of a fake engine client that
registers a request's choices after awaits of its own, as `EngineClient.submit` does (it
tokenizes the request's strings first), and keeps what it was given."""

from __future__ import annotations

import asyncio
import json

from opentelemetry.trace import Tracer
from starlette.requests import Request

from deployments.auth import APIKeyCheck
from deployments.config import ServeArgs
from deployments.in_flight import ChoiceReservations
from deployments.ingress import Ingress
from deployments.metrics import IngressMetrics
from deployments.prompt_encoder import PromptEncoder
from engine.loader.model_files import load_tokenizer
from engine.tokenizer import TextTokenizer

WAIT_S = 60.0


class FakeRouter:
    def __init__(self) -> None:
        self.streams: dict[str, object] = {}
        self.most = 0


class FakeEngineClient:
    """Registers a request's choices after awaits of its own (``EngineClient.submit`` tokenizes strings
    first); a whole response holds them until `finish` is set."""

    def __init__(self) -> None:
        self.router = FakeRouter()
        self.finish = asyncio.Event()
        self.count = 0
        self.collecting = 0
        self.gate = asyncio.Event()  # submit waits here before it registers anything (open unless a test closes it)
        self.gate.set()
        self.at_gate = 0
        self.submitted: list[object] = []  # the sampling parameters of each request
        self.clients: list[str] = []  # the client each request was keyed by
        self.client_ids: list[str | None] = []  # the name each request's client gave itself (X-Client-Id)
        self.answers: list[object] = []  # each request's answer rules (with a reasoning parser)

    async def submit(self, fmt, prompts, params, echo, client, client_id=None, answer=None) -> list[str]:
        self.submitted.append(params)
        self.answers.append(answer)
        self.clients.append(client)
        self.client_ids.append(client_id)
        for _ in range(3):
            await asyncio.sleep(0)
        self.at_gate += 1
        try:
            await self.gate.wait()
        finally:
            self.at_gate -= 1
        ids = []
        for _ in range(len(prompts) * params.n):
            self.count += 1
            ids.append(str(self.count))
            self.router.streams[ids[-1]] = object()
        self.router.most = max(self.router.most, len(self.router.streams))
        return ids

    async def collect(self, ids: list[str]) -> dict:
        self.collecting += 1
        try:
            await self.finish.wait()
        finally:
            self.collecting -= 1
            for stream_id in ids:
                del self.router.streams[stream_id]
        return {"choices": len(ids)}


def replica(
    model: str = "tiny-random", max_model_len: int = 256, tracer: Tracer | None = None, tokenizer: TextTokenizer | None = None, **options: object
) -> Ingress:
    """An `Ingress` as a replica builds it with ``options``, less Serve and its engine client (`attach`
    gives it one); ``tracer``: tracing on; ``tokenizer``: ``model``'s, where the caller has it loaded."""
    made = object.__new__(Ingress)
    made.tracer = tracer
    made.args = ServeArgs(model=model, max_model_len=max_model_len, **options)
    made.auth = APIKeyCheck(None)
    made.tokenizer = tokenizer or load_tokenizer(model)
    made.encoder = PromptEncoder(made.tokenizer, made.args.max_encode_backlog_bytes, inline_max_bytes=made.args.inline_encode_max_bytes)
    made.metrics = IngressMetrics(made.args.model_name, "test-replica")
    made.max_model_len = max_model_len
    made.in_flight = ChoiceReservations()
    made.trust_local_proxy = False
    made.local_addresses = frozenset()
    return made


def attach(made: Ingress, client: object) -> Ingress:
    """``made`` with ``client`` as its started engine client (on the running loop)."""
    made.engine_client = asyncio.get_running_loop().create_future()
    made.engine_client.set_result(client)
    return made


def ingress(client: FakeEngineClient, tracer: Tracer | None = None, **options: object) -> Ingress:
    """An `Ingress` as a replica builds it with ``options``, in front of ``client`` (``tracer``: tracing on)."""
    return attach(replica(tracer=tracer, **options), client)


def post(path: str, body: dict, peer: str = "127.0.0.1", headers: list[tuple[bytes, bytes]] = ()) -> Request:
    """A POST of ``body`` from ``peer`` with ``headers`` besides the JSON ones."""
    raw = json.dumps(body).encode()
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()), *headers],
        "client": (peer, 40000),
        "server": ("127.0.0.1", 8000),
        "scheme": "http",
        "root_path": "",
    }

    async def receive() -> dict:
        return {"type": "http.request", "body": raw, "more_body": False}

    return Request(scope, receive)


def completion(n: int, prompt: str = "hello there", max_tokens: int | None = 4) -> Request:
    """A completion request (``max_tokens`` None: the field left out)."""
    body = {"model": "tiny-random", "prompt": prompt, "n": n} | ({} if max_tokens is None else {"max_tokens": max_tokens})
    return post("/v1/completions", body)


def chat(n: int, max_tokens: int | None = 4) -> Request:
    """A chat request (``max_tokens`` None: the field left out)."""
    body = {"model": "tiny-random", "messages": [{"role": "user", "content": "hi"}], "n": n} | ({} if max_tokens is None else {"max_tokens": max_tokens})
    return post("/v1/chat/completions", body)


async def until(condition, timeout_s: float = WAIT_S) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)
