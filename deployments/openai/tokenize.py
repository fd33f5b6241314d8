"""vLLM's ``POST /tokenize`` and ``POST /detokenize`` bodies.

``/tokenize`` takes a ``prompt`` (encoded as a completion's prompt: special tokens written in it
recognised, the tokenizer's BOS added unless ``add_special_tokens`` is false) or ``messages``
(rendered as a chat's prompt, with the same tools and options, `deployments.openai.chat_prompt`),
and answers ``{"count", "max_model_len", "tokens", "token_strs"}``; ``token_strs`` (the
vocabulary's strings of the ids, as ``convert_ids_to_tokens`` gives them) only with
``return_token_strs``. ``/detokenize`` takes ``tokens`` and answers ``{"prompt"}``, the ids'
text with their special tokens written out. ``model`` is optional, as in vLLM.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from deployments.openai.chat_prompt import ChatMessage, ChatPrompt
from deployments.openai.errors import APIError
from deployments.openai.protocol import TokenId


class TokenizeRequest(ChatPrompt):
    """A ``prompt`` or ``messages`` (with the chat's fields), one of the two."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)  # type: ignore[assignment]
    add_special_tokens: bool | None = None
    """Default: true for a prompt, false for messages (the chat template writes a chat's special tokens)."""
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_form(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise APIError(400, "give a prompt or messages, one of the two", param="prompt")
        chat_fields = {"tools", "add_generation_prompt", "continue_final_message", "chat_template_kwargs"} & self.model_fields_set
        if self.prompt is not None and chat_fields:
            raise APIError(400, f"{min(chat_fields)} goes with messages, not with a prompt", param=min(chat_fields))
        if self.messages is not None and self.add_special_tokens:
            raise APIError(400, "add_special_tokens: the chat template writes a chat's special tokens itself", param="add_special_tokens")
        return self


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    tokens: list[TokenId] = Field(min_length=1)


def tokenize_response(ids: list[int], max_model_len: int, token_strs: list[str] | None) -> dict[str, object]:
    return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": token_strs}
