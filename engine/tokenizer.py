"""`TextTokenizer`: a `tokenizers.Tokenizer` with the model's special ids and chat template.

Text is text: in a chat, only the template's own markup becomes control tokens; the text of
a message that spells a special token (``<|im_end|>``) is encoded as ordinary text, so a
message cannot forge a turn. A completion's string prompt is the client's whole prompt, and
the special tokens written in it are recognised (`encode`).

Given ``max_tokens``, both refuse a text too long for it (`PromptTooLong`) from a bounded
prefix of the work (`engine.prompt_length`); a chat is refused by its plain encoding before
its message text is kept apart from the markup. Keeping it apart costs one sweep over the
control tokens and the message spans, both in text order.
"""

from __future__ import annotations

import datetime
import itertools
import json
import re
import secrets
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.prompt_length import PromptLength, PromptTooLong


class ChatTemplateError(ValueError):
    """The model has no chat template, or rendering it failed for these messages."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """Hugging Face's ``tojson`` filter: plain JSON (Jinja's own escapes ``<``, ``>``, ``&`` and ``'`` for HTML)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.datetime.now().strftime(format)


class GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: marks the assistant's own text in templates written
    for transformers' assistant-token masks; rendering keeps the body as it is, as transformers does."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Any) -> str:
        return caller()


def template_environment() -> ImmutableSandboxedEnvironment:
    """A sandbox that renders chat templates as transformers' ``apply_chat_template`` does: its
    whitespace options, ``{% break %}`` / ``{% continue %}``, ``{% generation %}``, ``tojson``,
    ``raise_exception``, ``strftime_now``."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, GenerationBlock])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


TEMPLATE_VARIABLES = frozenset({"messages", "add_generation_prompt", "tools", "bos_token", "eos_token"})
"""The variables the render sets from the request and the tokenizer: ``chat_template_kwargs`` may not set them."""


def open_final_message(rendered: str, messages: list[dict[str, Any]]) -> str:
    """``rendered`` cut right after the last message's content, as transformers cuts it for
    ``continue_final_message`` (the content found from the end, its surrounding whitespace as the
    template left it): the markup that closes the turn goes, so the model continues that message."""
    content = messages[-1]["content"] if messages else ""
    stripped = content.strip() if isinstance(content, str) else ""
    at = rendered.rfind(stripped) if stripped else -1
    if at < 0:
        raise ChatTemplateError("continue_final_message: the final message must have text, and the chat template must write it")
    end = at + len(stripped)
    kept_tail = content[len(content.rstrip()) :]
    return rendered[: end + len(kept_tail)] if rendered.startswith(kept_tail, end) else rendered[:end]


@dataclass
class TextTokenizer:
    tokenizer: tokenizers.Tokenizer
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None = None
    chat_template: str | None = field(default=None, repr=False)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True, max_tokens: int | None = None) -> list[int]:
        """Token ids of ``text``; special tokens written in the text are recognised.

        ``add_special_tokens`` runs the tokenizer's post-processor (BOS where the model wants one);
        `PromptTooLong` when ``text`` has more than ``max_tokens`` tokens.
        """
        return self._encode_within(text, add_special_tokens, max_tokens).ids

    def _encode_within(self, text: str, add_special_tokens: bool, max_tokens: int | None) -> tokenizers.Encoding:
        if max_tokens is None:
            return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        self._length.check(text, max_tokens)
        encoding = self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        if len(encoding) > max_tokens:
            raise PromptTooLong(len(encoding), max_tokens)
        return encoding

    @cached_property
    def _length(self) -> PromptLength:
        return PromptLength.of(self.tokenizer)

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
        return template_environment().from_string(self.chat_template)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        *,
        continue_final_message: bool = False,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text for ``messages`` ([{"role", "content"}, ...], ``content`` a string) and
        ``tools`` (function definitions, passed to the template as Hugging Face passes them).

        ``template_kwargs``: more variables for the template (vLLM's ``chat_template_kwargs``, such as
        ``enable_thinking``), none of the names the render sets itself (`TEMPLATE_VARIABLES`);
        ``continue_final_message``: the text ends with the last message's content, without the markup
        that closes its turn, so the model continues that message (`open_final_message`)."""
        token = self.tokenizer.id_to_token
        variables = {
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
            "tools": tools,
            "bos_token": token(self.bos_token_id) if self.bos_token_id is not None else "",
            "eos_token": token(self.eos_token_ids[0]) if self.eos_token_ids else "",
        }
        clashing = sorted(set(template_kwargs or {}) & TEMPLATE_VARIABLES)
        if clashing:
            raise ChatTemplateError(f"chat_template_kwargs may not set {', '.join(clashing)}: the request's own fields do")
        try:
            rendered = self._compiled_template.render({**(template_kwargs or {}), **variables})
        except jinja2.TemplateError as error:
            raise ChatTemplateError(f"chat template failed: {error}") from error
        return open_final_message(rendered, messages) if continue_final_message else rendered

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
        *,
        continue_final_message: bool = False,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """The prompt's token ids (the options as `apply_chat_template` takes them); special-token text
        inside a message's content stays text; `ChatTemplateError` for tools, tool calls or template
        variables that spell a special token, `PromptTooLong` for a prompt of more than ``max_tokens`` tokens."""
        self._check_outside_content(messages, [tools, template_kwargs])
        options = {"continue_final_message": continue_final_message, "template_kwargs": template_kwargs}
        text = self.apply_chat_template(messages, add_generation_prompt, tools, **options)
        # The template writes BOS itself where the model wants one.
        encoding = self._encode_within(text, False, max_tokens)
        if not any(self._special_pattern.search(message["content"]) for message in messages):
            return encoding.ids  # every control token comes from the markup
        ids = self._encode_with_text_spans(text, encoding, self._content_spans(messages, add_generation_prompt, text, tools, **options))
        if max_tokens is not None and len(ids) > max_tokens:
            raise PromptTooLong(len(ids), max_tokens)
        return ids

    def _check_outside_content(self, messages: list[dict[str, Any]], other: object) -> None:
        """The client's text that the template writes outside the contents (``other``: tools, template
        variables; a message's tool calls) cannot be kept apart from the markup, so it may not spell a special token."""
        outside = json.dumps([other, [{k: v for k, v in m.items() if k != "content"} for m in messages]], ensure_ascii=False)
        spelt = next((special for special in self._special_texts if special in outside), None)
        if spelt is not None:
            raise ChatTemplateError(f"the tools or tool calls spell the special token {spelt!r}")

    def _encode_with_text_spans(self, text: str, encoding: tokenizers.Encoding, spans: list[tuple[int, int]]) -> list[int]:
        """``text`` with the control tokens of ``encoding`` that lie outside ``spans`` kept, and everything
        between them encoded with special-token text read as ordinary text."""
        markup = markup_tokens(encoding.ids, encoding.offsets, self._special_ids, spans)
        between = zip([0, *(end for _, end, _ in markup)], [*(start for start, _, _ in markup), len(text)])
        texts = self._text_only.encode_batch([text[start:end] for start, end in between], add_special_tokens=False)
        ids: list[int] = []
        for encoded, (_, _, token) in zip(texts, markup):
            ids += encoded.ids
            ids.append(token)
        return ids + texts[-1].ids

    @cached_property
    def _special_ids(self) -> frozenset[int]:
        return frozenset(i for i, token in self.tokenizer.get_added_tokens_decoder().items() if token.special)

    @cached_property
    def _special_texts(self) -> tuple[str, ...]:
        return tuple(token.content for token in self.tokenizer.get_added_tokens_decoder().values() if token.special)

    @cached_property
    def _special_pattern(self) -> re.Pattern[str]:
        """Matches any special token's text (nothing when there are none)."""
        return re.compile("|".join(map(re.escape, self._special_texts)) or "(?!)")

    @cached_property
    def _text_only(self) -> tokenizers.Tokenizer:
        """A copy of the tokenizer that reads special tokens' text as ordinary text."""
        copy = tokenizers.Tokenizer.from_str(self.tokenizer.to_str())
        copy.encode_special_tokens = True
        return copy

    def _content_spans(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool, text: str, tools: list[dict[str, Any]] | None, **options: Any
    ) -> list[tuple[int, int]]:
        """Where the messages' contents lie in ``text`` (the rendered template): the template is rendered
        again with each content between markers no client can know, then the markers are removed."""
        nonce = secrets.token_hex(8)
        marked = [{**m, "content": f"\x00{nonce}<{i}\x00{m['content']}\x00{nonce}>{i}\x00"} for i, m in enumerate(messages)]
        rendered = self.apply_chat_template(marked, add_generation_prompt, tools, **options)
        pieces = re.split(f"\x00{nonce}([<>])\\d+\x00", rendered)  # text, kind, text, kind, ..., text
        texts, kinds = pieces[0::2], pieces[1::2]
        if "".join(texts) != text or kinds != ["<", ">"] * (len(kinds) // 2):
            raise ChatTemplateError(
                "this model's chat template changes message text, so a message that spells a special token cannot be kept apart from its markup"
            )
        ends = list(itertools.accumulate(map(len, texts)))  # a marker after texts[k] sits at ends[k]
        return [(ends[k], ends[k + 1]) for k in range(0, len(kinds), 2)]


def markup_tokens(ids: list[int], offsets: list[tuple[int, int]], special_ids: frozenset[int], spans: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(start, end, id) of each control token among ``ids`` (at ``offsets``) that overlaps none of
    ``spans``, the messages' text: one sweep, since the tokens and the disjoint spans are both
    in text order (a span that ends before a token starts ends before every later one)."""
    markup = []
    span = 0
    for token, (start, end) in zip(ids, offsets):
        if token not in special_ids:
            continue
        while span < len(spans) and spans[span][1] <= start:
            span += 1
        if span == len(spans) or end <= spans[span][0]:
            markup.append((start, end, token))
    return markup
