"""The OpenAI ingress: HTTP routing, auth, limits, and the request handlers."""

from __future__ import annotations

import asyncio
import contextvars
import os
import uuid
from typing import TypeVar

from pydantic import BaseModel
from ray import serve
from ray.serve.handle import DeploymentHandle
from ray.serve.schema import ApplicationStatus
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import Receive, Scope, Send

from deployments.agent_apis import AgentAPIs, Answer
from deployments.anthropic.errors import MESSAGES_PATH
from deployments.anthropic.errors import error_response as anthropic_error_response
from deployments.auth import APIKeyCheck
from deployments.config import ServeArgs
from deployments.detok_pool import DetokClient, Detokenizer
from deployments.engine_client import EngineClient
from deployments.engine_placement import engine_handles, kill_engines
from deployments.health import SharedCheck
from deployments.http_server import HttpServer
from deployments.in_flight import ChoiceReservations, Reservation
from deployments.ingress_autoscaling import REQUESTS_METRIC
from deployments.limits import (
    check_context_length,
    check_echo,
    check_messages,
    check_prompt_logprobs,
    check_prompts,
    check_sampling,
    check_structured_outputs,
    context_length_error,
)
from deployments.metrics import CONTENT_TYPE, IngressMetrics, ReplicaState
from deployments.openai.errors import APIError, internal_error
from deployments.openai.openapi import openapi_document
from deployments.openai.protocol import ChatCompletionRequest, CompletionRequest
from deployments.openai.reasoning import answer_budget, constrained_after_thinking
from deployments.openai.request_body import read_body, validate_body
from deployments.openai.responses import ResponseFormat
from deployments.openai.tool_calls import constrain_to_json_schema, tool_call_output, tool_call_schema
from deployments.openai.tool_prompt import template_messages
from deployments.peers import behind_haproxy, client_address, client_id, local_addresses
from deployments.prompt_encoder import PromptEncoder
from deployments.replica_front import start_replica_front
from deployments.token_routes import TokenRoutes
from deployments.tracing import RequestTrace, current_trace, tracer_from_environment
from detok import AnswerRules
from engine.loader.model_files import load_tokenizer
from engine.prompt_length import PromptTooLong
from engine.tokenizer import ChatTemplateError
from sampling.params import SamplingParams

ENGINE_START_TIMEOUT_S = 600.0  # loading the model
HEALTH_TIMEOUT_S = 10.0
PROMPT_TAIL_IDS = 16
"""The prompt's last ids a reasoning parser reads to know whether the template closed the thinking."""
HEALTH_MAX_AGE_S = 1.0
"""/health (open without a key) checks the engines at most once a second; callers in between share the outcome."""
RequestBody = TypeVar("RequestBody", bound=BaseModel)


def application_running(app_name: str) -> bool:
    """Whether Serve still runs or deploys ``app_name``: not once it is being deleted, or Serve shut down."""
    try:
        status = serve.status().applications.get(app_name)
    except Exception:  # Serve's controller is gone, and the application with it
        return False
    return status is not None and status.status != ApplicationStatus.DELETING


def app_path(request: Request) -> str:
    """The request's path under the app's route prefix (``/v1/completions`` of an app served at
    ``/think`` is asked for as ``/think/v1/completions``): ASGI's ``path`` holds the prefix, which
    Serve also puts in ``root_path``."""
    path, prefix = request.scope["path"], request.scope.get("root_path", "").rstrip("/")  # the scope's: starlette's URL object costs about 4 µs
    return (path[len(prefix) :] or "/") if prefix and (path == prefix or path.startswith(prefix + "/")) else path


class Ingress(AgentAPIs, TokenRoutes):
    """Serve deployment body (options set in `deployments.app`)."""

    def __init__(self, args: dict, detok_pool: DeploymentHandle[Detokenizer] | None) -> None:
        self.args = ServeArgs.from_options(args, os.environ)
        self.auth = APIKeyCheck(self.args.api_key)
        self.tokenizer = load_tokenizer(self.args.model)
        context = serve.get_replica_context()
        self.app_name = context.app_name
        self.engines = engine_handles(self.args, self.app_name)
        self.metrics = IngressMetrics(self.args.model_name, context.replica_id.unique_id)
        self.encoder = PromptEncoder(self.tokenizer, self.args.max_encode_backlog_bytes, inline_max_bytes=self.args.inline_encode_max_bytes)
        self.detok = DetokClient(self.tokenizer.tokenizer, detok_pool, self.args.inline_detok_threshold, self.args.detok_tokens_per_call)
        self.subscriber = uuid.uuid4().hex
        self.engine_client: asyncio.Task[EngineClient] | None = None
        self.max_model_len: int | None = None
        self.health_check = SharedCheck(self._check_engines, HEALTH_MAX_AGE_S)
        self.in_flight = ChoiceReservations()
        self.trust_local_proxy = behind_haproxy()
        self.local_addresses = local_addresses()
        self.tracer = tracer_from_environment(os.environ)
        self.http_server: HttpServer | None = None
        if self.args.http_front == "replica":
            self.trust_local_proxy = False
            self.http_server, self.http_serving = start_replica_front(self.asgi, self.args, self.app_name, context.rank.local_rank)

    async def asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The replica as an ASGI app, for its own HTTP server (``http_front=replica``)."""
        response = await self(Request(scope, receive))
        await response(scope, receive, send)

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve calls this periodically: the requests the replica's own server has in flight, which
        the replica front's autoscaling policy counts (`deployments.ingress_autoscaling`). A coroutine,
        so that it runs on the replica's event loop, which the server's connections belong to."""
        return {REQUESTS_METRIC: self.http_server.requests_in_flight() if self.http_server is not None else 0}

    async def __del__(self) -> None:
        """Serve awaits this when the replica stops. Its own HTTP server (``http_front=replica``) takes no
        new connection and lets the streams in flight end, for up to ``replica_drain_timeout_s``. When
        the application is being deleted (or Serve shuts down), its engines go with it; a replica that
        scales down or gives way to a redeploy leaves them."""
        if self.http_server is not None:
            await self.http_server.drain(self.args.replica_drain_timeout_s)
        app_name = self.__dict__.pop("app_name", None)
        if app_name is not None and not application_running(app_name):
            kill_engines(app_name)

    async def _ready(self) -> EngineClient:
        """The replica's one `EngineClient` (one output loop per engine), made by the first request;
        concurrent first requests await the same task, and a failed start is tried again."""
        if self.engine_client is None or (self.engine_client.done() and self.engine_client.exception() is not None):
            # An empty context, so that Ray does not cancel the start with the request that began it.
            self.engine_client = asyncio.get_running_loop().create_task(self._start(), context=contextvars.Context())
        return await asyncio.shield(self.engine_client)

    async def _start(self) -> EngineClient:
        lengths = [await asyncio.wait_for(engine.ready.remote(), ENGINE_START_TIMEOUT_S) for engine in self.engines]
        self.max_model_len = min(lengths)
        args = self.args
        return EngineClient(
            self.engines, self.subscriber, self.encoder, self.detok, self.metrics, args.stream_interval, args.stream_idle_timeout_s, args.engine_routing_rules()
        )

    async def __call__(self, request: Request) -> Response:
        path = app_path(request)
        trace = RequestTrace(self.tracer, request.method, path, request.headers) if self.tracer is not None else None
        current_trace.set(trace)  # this request's task only: read where the engine takes the request
        try:
            response = await self._route(request, path.rstrip("/"))
        except APIError as error:
            response = self._error_response(path, error)
        except Exception as error:
            response = self._error_response(path, internal_error(error, path))
        self.metrics.requests.inc(str(response.status_code))
        if trace is not None:
            trace.answered(response.status_code)
        return response

    async def _route(self, request: Request, path: str) -> Response:
        method = request.method
        routes = {
            "/v1/completions": ("POST", self.completions),
            "/v1/chat/completions": ("POST", self.chat_completions),
            "/v1/models": ("GET", self.models),
            "/v1/responses": ("POST", self.responses),
            "/v1/messages": ("POST", self.messages),
            "/v1/messages/count_tokens": ("POST", self.count_tokens),
            "/tokenize": ("POST", self.tokenize),
            "/detokenize": ("POST", self.detokenize),
            "/health": ("GET", self.health),
            "/metrics": ("GET", self.metrics_text),
            "/openapi.json": ("GET", self.openapi),
        }
        self.auth.check(path, request.headers.get("authorization"), request.headers.get("x-api-key"))  # before the route is looked up
        if path not in routes:
            raise APIError(404, f"no route {path}", code="not_found")
        expected, handler = routes[path]
        if method != expected:
            raise APIError(405, f"{path} takes {expected}, not {method}", code="method_not_allowed")
        return await handler(request)

    @staticmethod
    def _error_response(path: str, error: APIError) -> Response:
        """OpenAI's error JSON, or Anthropic's on the Messages API's routes."""
        return anthropic_error_response(error) if path.startswith(MESSAGES_PATH) else error.response()

    def _check_model(self, model: str) -> None:
        if model != self.args.model_name:
            raise APIError(404, f"model {model!r} does not exist; this server serves {self.args.model_name!r}", param="model", code="model_not_found")

    def _check_prompt(self, prompt: list[int], param: str) -> None:
        assert self.max_model_len is not None
        if not prompt:
            raise APIError(400, "the prompt is empty", param=param)
        check_context_length(len(prompt), self.max_model_len, param)

    def _too_long(self, error: PromptTooLong, param: str) -> APIError:
        assert self.max_model_len is not None
        return context_length_error(error.tokens, self.max_model_len, param, at_least=True)

    async def _parse(self, request: Request, model: type[RequestBody]) -> RequestBody:
        raw = await read_body(request.stream(), request.headers.get("content-length"), self.args.max_body_bytes)
        body = await validate_body(raw, self.args.max_json_depth, model)
        if body.model is not None:  # optional where vLLM has it so (/tokenize, /detokenize)
            self._check_model(body.model)
        return body

    async def _check_constraint(self, params: SamplingParams, param: str) -> None:
        """400 naming ``param`` (the field the constraint came from) when the output constraint is too large or does not compile."""
        if params.structured_outputs is None:
            return
        check_structured_outputs(self.args, params, param)
        error = await self.encoder.grammar_error(params.structured_outputs, self.args.grammar_limits())
        if error is not None:
            raise APIError(400, f"{param}: {error}", param=param, code="invalid_grammar")

    async def _submit(
        self,
        request: Request,
        client: EngineClient,
        fmt: ResponseFormat,
        prompts: list[list[int]],
        body: CompletionRequest | ChatCompletionRequest,
        params: SamplingParams,
        echo: bool,
        reservation: Reservation,
        answer: Answer | None = None,
        answer_rules: AnswerRules | None = None,
    ) -> Response:
        """Submit the choices, then answer with their stream or their whole response (the router
        counts the choices from then on, so their reservation ends); ``answer``: another API's writer
        of the submission (None: a completion's or a chat's); ``answer_rules``: with a reasoning parser,
        where the answer that stop strings and max_tokens apply to begins."""
        check_prompt_logprobs(self.args, prompts, params, "prompt_logprobs" if body.asked_prompt_logprobs is not None else "echo")
        address = client_address(request, self.trust_local_proxy, self.local_addresses)
        submission = await client.submit(fmt, prompts, params, echo, address, client_id(request), answer_rules)
        reservation.release()
        if answer is not None:
            return await answer(client, submission, fmt.tool_calls)
        if body.stream:
            return client.stream(submission, body.stream_usage)
        return JSONResponse(await client.collect(submission))

    async def completions(self, request: Request) -> Response:
        body = await self._parse(request, CompletionRequest)
        params = body.sampling_params()
        texts_or_ids = body.prompts()
        choices = len(texts_or_ids) * params.n
        check_sampling(self.args, params, choices, self.args.num_speculative_tokens, body.structured_param)
        check_echo(self.args, body.echo, choices)
        await self._check_constraint(params, body.structured_param)
        client = await self._ready()
        assert self.max_model_len is not None
        check_prompts(self.args, texts_or_ids, self.max_model_len)
        with self.in_flight.reserve(self.args, len(client.router.streams), choices) as reservation:
            try:
                prompts = await self.encoder.prompts(texts_or_ids, max_tokens=self.max_model_len - 1)
            except PromptTooLong as error:
                raise self._too_long(error, "prompt") from error
            for prompt in prompts:
                self._check_prompt(prompt, "prompt")
            fmt = ResponseFormat.new(
                f"cmpl-{uuid.uuid4().hex}", self.args.model_name, chat=False, prompt_logprobs=body.asked_prompt_logprobs, echo_logprobs=body.echo_logprobs
            )
            return await self._submit(request, client, fmt, prompts, body, params, body.echo, reservation)

    async def chat_completions(self, request: Request) -> Response:
        return await self._chat(request, await self._parse(request, ChatCompletionRequest))

    async def _chat(self, request: Request, body: ChatCompletionRequest, answer: Answer | None = None) -> Response:
        """A chat, checked, rendered and submitted; answered as a chat, or by ``answer`` (the Responses
        and Messages APIs, whose requests are chats: `deployments.agent_apis`)."""
        params = body.sampling_params(self.args.default_max_tokens)
        text_bytes = check_messages(self.args, body.client_texts(), len(body.messages), len(body.tools or []))
        schema = tool_call_schema(body)
        if schema is not None:  # the tool call is then the output's only constraint
            params = constrain_to_json_schema(params, schema)
        structured_param = "tool_choice" if schema is not None else body.structured_param
        check_sampling(self.args, params, params.n, self.args.num_speculative_tokens, structured_param)
        await self._check_constraint(params, structured_param)
        messages, tools = template_messages(body.messages, body.offered_tools, self.tokenizer.template_takes_tools)
        client = await self._ready()
        assert self.max_model_len is not None
        with self.in_flight.reserve(self.args, len(client.router.streams), params.n) as reservation:
            try:
                prompt = await self.encoder.chat(messages, body.add_generation_prompt, tools, self.max_model_len - 1, text_bytes, **body.template_options())
            except ChatTemplateError as error:
                raise APIError(400, str(error), param="messages") from error
            except PromptTooLong as error:
                raise self._too_long(error, "messages") from error
            self._check_prompt(prompt, "messages")
            answer_rules = None
            if self.args.reasoning_parser is not None:
                params = constrained_after_thinking(params, self.tokenizer.decode(prompt[-PROMPT_TAIL_IDS:], skip_special_tokens=False))
                params, answer_rules = answer_budget(params, self.args.reasoning(), self.args.max_thinking_tokens)  # type: ignore[arg-type]
            calls = tool_call_output(body, self.args.tool_call_parser, self.args.max_tool_call_bytes)
            fmt = ResponseFormat.new(
                f"chatcmpl-{uuid.uuid4().hex}",
                self.args.model_name,
                chat=True,
                tool_calls=calls,
                prompt_logprobs=body.asked_prompt_logprobs,
                reasoning=self.args.reasoning(),
            )
            return await self._submit(request, client, fmt, [prompt], body, params, False, reservation, answer, answer_rules)

    async def models(self, request: Request) -> Response:
        await self._ready()
        card = {"id": self.args.model_name, "object": "model", "created": 0, "owned_by": "spout", "max_model_len": self.max_model_len}
        return JSONResponse({"object": "list", "data": [card]})

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(openapi_document())

    async def health(self, request: Request) -> Response:
        try:
            await self.health_check()
        except Exception as error:
            raise APIError(503, f"unhealthy: {error}", code="unhealthy") from error
        return PlainTextResponse("ok")

    async def _check_engines(self) -> None:
        await asyncio.wait_for(self._ready(), HEALTH_TIMEOUT_S)
        for engine in self.engines:
            await asyncio.wait_for(engine.stats.remote(), HEALTH_TIMEOUT_S)

    async def metrics_text(self, request: Request) -> Response:
        engine_stats = [await asyncio.wait_for(engine.stats.remote(), HEALTH_TIMEOUT_S) for engine in self.engines]
        client = await self._ready()
        total = self.detok.inline_batches + self.detok.pool_batches
        replica = ReplicaState(live_choices=len(client.router.streams), detok_inline_share=self.detok.inline_batches / total if total else 1.0)
        return Response(self.metrics.render(engine_stats, replica), media_type=CONTENT_TYPE)
