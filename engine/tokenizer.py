"""`TextTokenizer`: a `tokenizers.Tokenizer` with the model's special ids and chat template.

Text is text: in a chat, only the template's own markup becomes control tokens; the text of
a message that spells a special token (``<|im_end|>``) is encoded as ordinary text, so a
message cannot forge a turn. A completion's string prompt is the client's whole prompt, and
the special tokens written in it are recognised (`encode`).
"""

from __future__ import annotations

import itertools
import json
import re
import secrets
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

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

    @property
    def template_takes_tools(self) -> bool:
        """Whether the chat template reads ``tools`` (llama.cpp's test: the name appears in its source)."""
        return bool(self.chat_template) and "tools" in self.chat_template

    @cached_property
    def _compiled_template(self) -> jinja2.Template:
        if not self.chat_template:
            raise ChatTemplateError("this model has no chat template")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_exception
        return env.from_string(self.chat_template)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt text for ``messages`` ([{"role", "content"}, ...], ``content`` a string) and
        ``tools`` (function definitions, passed to the template as Hugging Face passes them)."""
        token = self.tokenizer.id_to_token
        try:
            return self._compiled_template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                tools=tools,
                bos_token=token(self.bos_token_id) if self.bos_token_id is not None else "",
                eos_token=token(self.eos_token_ids[0]) if self.eos_token_ids else "",
            )
        except jinja2.TemplateError as error:
            raise ChatTemplateError(f"chat template failed: {error}") from error

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The prompt's token ids; special-token text inside a message's content stays text, and
        `ChatTemplateError` for tools or tool calls that spell a special token."""
        self._check_outside_content(messages, tools)
        text = self.apply_chat_template(messages, add_generation_prompt, tools)
        # The template writes BOS itself where the model wants one.
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        if not any(special in message["content"] for message in messages for special in self._special_texts):
            return encoding.ids  # every control token comes from the markup
        return self._encode_with_text_spans(text, encoding, self._content_spans(messages, add_generation_prompt, text, tools))

    def _check_outside_content(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> None:
        """The client's text that the template writes outside the contents (tools, a message's tool
        calls) cannot be kept apart from the markup, so it may not spell a special token."""
        outside = json.dumps([tools, [{k: v for k, v in m.items() if k != "content"} for m in messages]], ensure_ascii=False)
        spelt = next((special for special in self._special_texts if special in outside), None)
        if spelt is not None:
            raise ChatTemplateError(f"the tools or tool calls spell the special token {spelt!r}")

    def _encode_with_text_spans(self, text: str, encoding: tokenizers.Encoding, spans: list[tuple[int, int]]) -> list[int]:
        """``text`` with the control tokens of ``encoding`` that lie outside ``spans`` kept, and everything
        between them encoded with special-token text read as ordinary text."""
        markup = [
            (start, end, token)
            for token, (start, end) in zip(encoding.ids, encoding.offsets)
            if token in self._special_ids and not any(start < span_end and span_start < end for span_start, span_end in spans)
        ]
        ids: list[int] = []
        position = 0
        for start, end, token in markup:
            ids += self._text_only.encode(text[position:start], add_special_tokens=False).ids if start > position else []
            ids.append(token)
            position = end
        return ids + (self._text_only.encode(text[position:], add_special_tokens=False).ids if position < len(text) else [])

    @cached_property
    def _special_ids(self) -> frozenset[int]:
        return frozenset(i for i, token in self.tokenizer.get_added_tokens_decoder().items() if token.special)

    @cached_property
    def _special_texts(self) -> tuple[str, ...]:
        return tuple(token.content for token in self.tokenizer.get_added_tokens_decoder().values() if token.special)

    @cached_property
    def _text_only(self) -> tokenizers.Tokenizer:
        """A copy of the tokenizer that reads special tokens' text as ordinary text."""
        copy = tokenizers.Tokenizer.from_str(self.tokenizer.to_str())
        copy.encode_special_tokens = True
        return copy

    def _content_spans(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool, text: str, tools: list[dict[str, Any]] | None
    ) -> list[tuple[int, int]]:
        """Where the messages' contents lie in ``text`` (the rendered template): the template is rendered
        again with each content between markers no client can know, then the markers are removed."""
        nonce = secrets.token_hex(8)
        marked = [{**m, "content": f"\x00{nonce}<{i}\x00{m['content']}\x00{nonce}>{i}\x00"} for i, m in enumerate(messages)]
        rendered = self.apply_chat_template(marked, add_generation_prompt, tools)
        pieces = re.split(f"\x00{nonce}([<>])\\d+\x00", rendered)  # text, kind, text, kind, ..., text
        texts, kinds = pieces[0::2], pieces[1::2]
        if "".join(texts) != text or kinds != ["<", ">"] * (len(kinds) // 2):
            raise ChatTemplateError(
                "this model's chat template changes message text, so a message that spells a special token cannot be kept apart from its markup"
            )
        ends = list(itertools.accumulate(map(len, texts)))  # a marker after texts[k] sits at ends[k]
        return [(ends[k], ends[k + 1]) for k in range(0, len(kinds), 2)]
