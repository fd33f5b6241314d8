"""The APIs agents speak, as routes of the ingress: OpenAI's Responses API (``POST /v1/responses``)
and Anthropic's Messages API (``POST /v1/messages``, ``POST /v1/messages/count_tokens``).

Each request is translated into the chat it means and goes through the chat's own path
(`deployments.ingress.Ingress._chat`: limits, template, constraint checks, submission); only the
answer differs, written by the API's own writer from the same deltas
(`deployments.engine_client.EngineClient.deltas`), so streaming, detokenization, limits, aborts on
disconnect and metrics are the chat's.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from deployments.anthropic.messages_request import CountTokensRequest, MessagesRequest
from deployments.anthropic.messages_writer import MessageBuilder, MessageFrames, message_body
from deployments.limits import check_messages
from deployments.openai.errors import APIError
from deployments.openai.responses_request import ResponsesRequest
from deployments.openai.responses_writer import ResponseBuilder, ResponseFrames, response_body
from deployments.openai.tool_calls import ToolCallOutput
from deployments.openai.tool_prompt import template_messages
from engine.tokenizer import ChatTemplateError

if TYPE_CHECKING:
    from deployments.config import ServeArgs
    from deployments.engine_client import EngineClient, Submission
    from deployments.openai.protocol import ChatCompletionRequest
    from deployments.prompt_encoder import PromptEncoder
    from engine.tokenizer import TextTokenizer

Body = TypeVar("Body", bound=BaseModel)

Answer = Callable[["EngineClient", "Submission", ToolCallOutput | None], Awaitable[Response]]
"""Another API's answer to a submitted chat: its stream or its whole body."""


class AgentAPIs:
    """The routes of the Responses and Messages APIs (a base of `deployments.ingress.Ingress`)."""

    if TYPE_CHECKING:  # what they use of the ingress
        args: ServeArgs
        tokenizer: TextTokenizer
        encoder: PromptEncoder

        async def _parse(self, request: Request, model: type[Body]) -> Body: ...

        async def _chat(self, request: Request, body: ChatCompletionRequest, answer: Answer | None = None) -> Response: ...

    async def responses(self, request: Request) -> Response:
        body = await self._parse(request, ResponsesRequest)
        chat = body.chat_request()

        async def answer(client: EngineClient, submission: Submission, calls: ToolCallOutput | None) -> Response:
            builder = ResponseBuilder(f"resp_{uuid.uuid4().hex}", self.args.model_name, body.echo_fields(), submission.num_prompt_tokens)
            if body.stream:
                return client.event_stream(submission, ResponseFrames(builder, calls, self.args.reasoning()))
            return JSONResponse(await response_body(builder, calls, client.deltas(submission), self.args.reasoning()))

        return await self._chat(request, chat, answer)

    async def messages(self, request: Request) -> Response:
        body = await self._parse(request, MessagesRequest)
        chat = body.chat_request()

        async def answer(client: EngineClient, submission: Submission, calls: ToolCallOutput | None) -> Response:
            builder = MessageBuilder(f"msg_{uuid.uuid4().hex}", self.args.model_name, submission.num_prompt_tokens)
            if body.stream:
                return client.event_stream(submission, MessageFrames(builder, calls, self.args.reasoning()))
            return JSONResponse(await message_body(builder, calls, client.deltas(submission), self.args.reasoning()))

        return await self._chat(request, chat, answer)

    async def count_tokens(self, request: Request) -> Response:
        """The prompt a Messages request would send, counted (``{"input_tokens"}``), without generating."""
        body = await self._parse(request, CountTokensRequest)
        chat = body.chat_request()
        text_bytes = check_messages(self.args, chat.client_texts(), len(chat.messages), len(chat.tools or []))
        messages, tools = template_messages(chat.messages, chat.offered_tools, self.tokenizer.template_takes_tools)
        try:
            ids = await self.encoder.chat(messages, chat.add_generation_prompt, tools, None, text_bytes)
        except ChatTemplateError as error:
            raise APIError(400, str(error), param="messages") from error
        return JSONResponse({"input_tokens": len(ids)})
