"""`TextTokenizer`: a `tokenizers.Tokenizer` with the model's special ids and chat template."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import jinja2
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The model has no chat template, or rendering it failed for these messages."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


@dataclass
class TextTokenizer:
    tokenizer: tokenizers.Tokenizer
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None = None
    chat_template: str | None = field(default=None, repr=False)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; special tokens written in the text are recognised.

        ``add_special_tokens`` runs the tokenizer's post-processor (BOS where the model wants one).
        """
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    @cached_property
    def _compiled_template(self) -> jinja2.Template:
        if not self.chat_template:
            raise ChatTemplateError("this model has no chat template")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_exception
        return env.from_string(self.chat_template)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The prompt text for ``messages`` ([{"role", "content"}, ...])."""
        token = self.tokenizer.id_to_token
        try:
            return self._compiled_template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=token(self.bos_token_id) if self.bos_token_id is not None else "",
                eos_token=token(self.eos_token_ids[0]) if self.eos_token_ids else "",
            )
        except jinja2.TemplateError as error:
            raise ChatTemplateError(f"chat template failed: {error}") from error

    def encode_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        # The template writes BOS itself where the model wants one.
        return self.encode(self.apply_chat_template(messages, add_generation_prompt), add_special_tokens=False)
