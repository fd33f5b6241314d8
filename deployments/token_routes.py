"""vLLM's ``POST /tokenize`` and ``POST /detokenize`` as routes of the ingress (bodies and answers:
`deployments.openai.tokenize`): a prompt is encoded and a chat rendered exactly as completions and
chat do, on the replica's encoding pool, under the same body and prompt-size limits."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from deployments.limits import check_context_length, check_messages, check_prompts
from deployments.openai.errors import APIError
from deployments.openai.tokenize import DetokenizeRequest, TokenizeRequest, tokenize_response
from deployments.openai.tool_prompt import template_messages
from engine.tokenizer import ChatTemplateError

if TYPE_CHECKING:
    from deployments.config import ServeArgs
    from deployments.prompt_encoder import PromptEncoder
    from engine.tokenizer import TextTokenizer

Body = TypeVar("Body", bound=BaseModel)


class TokenRoutes:
    """``/tokenize`` and ``/detokenize`` (a base of `deployments.ingress.Ingress`, whose parsing, limits and encoder they use)."""

    if TYPE_CHECKING:  # what they use of the ingress
        args: ServeArgs
        tokenizer: TextTokenizer
        encoder: PromptEncoder
        max_model_len: int | None

        async def _ready(self) -> object: ...

        async def _parse(self, request: Request, model: type[Body]) -> Body: ...

    async def tokenize(self, request: Request) -> Response:
        """vLLM's ``/tokenize``: a prompt's or a chat's ids, their count and the context (`deployments.openai.tokenize`)."""
        body = await self._parse(request, TokenizeRequest)
        await self._ready()
        assert self.max_model_len is not None
        try:
            if body.messages is None:
                assert body.prompt is not None
                check_prompts(self.args, [body.prompt], self.max_model_len)
                ids = await self.encoder.encode(body.prompt, add_special_tokens=body.add_special_tokens is not False)
            else:
                text_bytes = check_messages(self.args, body.client_texts(), len(body.messages), len(body.tools or []))
                messages, tools = template_messages(body.messages, body.tools, self.tokenizer.template_takes_tools)
                ids = await self.encoder.chat(messages, body.add_generation_prompt, tools, None, text_bytes, **body.template_options())
        except ChatTemplateError as error:
            raise APIError(400, str(error), param="messages") from error
        strings = [self.tokenizer.tokenizer.id_to_token(i) for i in ids] if body.return_token_strs else None
        return JSONResponse(tokenize_response(ids, self.max_model_len, strings))

    async def detokenize(self, request: Request) -> Response:
        """vLLM's ``/detokenize``: the text of token ids, special tokens written out."""
        body = await self._parse(request, DetokenizeRequest)
        await self._ready()
        assert self.max_model_len is not None
        check_context_length(len(body.tokens) - 1, self.max_model_len, "tokens")  # as many as a context holds
        vocab_size = self.tokenizer.vocab_size
        if max(body.tokens) >= vocab_size:
            raise APIError(400, f"tokens: {max(body.tokens)} is not an id of this model's vocabulary of {vocab_size}", param="tokens")
        return JSONResponse({"prompt": await self.encoder.decode(body.tokens)})
