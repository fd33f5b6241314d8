"""`RequestLimits`: what one request may cost, set by the operator; the checks that enforce them.

The ingress runs these checks on a validated request before it tokenizes, builds or sends
anything: each refusal is an `APIError` (400, or 413 for sizes; 503 when the replica has too
many choices in flight) whose ``param`` names the request field and whose message names the
limit and its configuration key. Text sizes are counted in UTF-8 bytes, which bound the
tokens a byte-level tokenizer can make of them; each chat message also counts `MESSAGE_BYTES`
(its markup costs tokens and template work, so empty messages are not free). A prompt over
the model's context is a 400 (as vLLM answers), found from its tokens.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from deployments.openai.errors import APIError
from engine.beam.params import BeamSearchParamError, check_beam_params
from sampling.params import MAX_N, MAX_SPECULATIVE_TOKENS, SamplingParams

LIMIT_EXCEEDED = "limit_exceeded"
MESSAGE_BYTES = 32
"""What each chat message counts against ``max_prompt_bytes`` besides its text."""


class RequestLimits(BaseModel):
    """Per-request bounds; `deployments.config.ServeArgs` inherits them as flat options."""

    model_config = ConfigDict(extra="forbid")

    max_choices_per_request: int = Field(64, ge=1, le=MAX_N * 64, description="Prompts × n in one request.")
    max_choices_in_flight: int = Field(
        2048, ge=1, description="Choices an ingress replica streams or prepares at once (counted from a request's check); more get 503."
    )
    max_beam_width: int = Field(
        8, ge=1, le=MAX_N, description="n of a beam search (use_beam_search): engine sequences it holds, 2n candidates scored per beam per step."
    )
    max_prompt_bytes: int = Field(
        262_144, ge=1, description=f"UTF-8 bytes of one text prompt (all chat message text together, and {MESSAGE_BYTES} more per message)."
    )
    max_messages: int = Field(4096, ge=1, description="Messages of one chat request.")
    max_encode_backlog_bytes: int = Field(
        4 << 20,
        ge=1,
        description="UTF-8 bytes of client text an ingress replica's encode workers hold, queued or being encoded (each job counts 1 KiB more); "
        "a request that would pass it gets 503.",
    )
    inline_encode_max_bytes: int = Field(
        256,
        ge=0,
        le=4096,
        description=f"UTF-8 bytes of a request's text (chat: as max_prompt_bytes counts it, {MESSAGE_BYTES} more per message) up to which "
        "it is encoded on the ingress's event loop (at 256 bytes 45-220 µs, a chat of 8 messages about 100 µs), skipping the encode "
        "workers' thread hop (about 100 µs of CPU); 0: always on the workers.",
    )
    max_stop_strings: int = Field(16, ge=0, description="Entries of stop.")
    max_stop_bytes: int = Field(1024, ge=0, description="UTF-8 bytes of all stop strings together.")
    max_bad_words: int = Field(64, ge=0, description="Entries of bad_words.")
    max_bad_words_bytes: int = Field(2048, ge=0, description="UTF-8 bytes of all bad words together.")
    max_logit_bias: int = Field(1024, ge=0, description="Entries of logit_bias.")
    max_allowed_token_ids: int = Field(16_384, ge=0, description="Entries of allowed_token_ids.")
    max_stop_token_ids: int = Field(64, ge=0, description="Entries of stop_token_ids.")
    max_dry_breakers: int = Field(16, ge=0, description="Entries of dry_sequence_breakers.")
    max_dry_breakers_bytes: int = Field(64, ge=0, description="UTF-8 bytes of all DRY sequence breakers together.")
    max_negative_prompt_bytes: int = Field(32_768, ge=0, description="UTF-8 bytes of negative_prompt.")
    max_logprob_entries: int = Field(640, ge=0, description="logprobs × choices: top-logprob entries the request adds per step.")
    max_prompt_logprob_entries: int = Field(
        131_072,
        ge=0,
        description="Prompt tokens × (prompt_logprobs + 1) × choices: the prompt-logprob entries a request returns (echo with logprobs counts as logprobs).",
    )
    max_echo_choices: int = Field(16, ge=1, description="Choices of a request with echo (each carries its prompt's text).")
    max_client_speculative_tokens: int = Field(
        0,
        ge=0,
        le=MAX_SPECULATIVE_TOKENS,
        description="The most num_speculative_tokens a client may ask for beyond the server's own; 0: clients cannot turn speculation on.",
    )
    max_constrained_rows: int = Field(
        64,
        ge=0,
        description="Requests with an output constraint (response_format, structured_outputs, a required or named tool call) an engine runs at once; "
        "more wait their turn. Each makes every step of its engine synchronous (the next mask needs the sampled token); 0 refuses them (400).",
    )
    max_beam_rows: int = Field(
        64,
        ge=0,
        description="Beams of beam searches an engine runs at once; more searches wait their turn. Each makes every step of its engine "
        "synchronous; a search wider than this is refused (400), and 0 refuses use_beam_search.",
    )
    max_json_depth: int = Field(32, ge=2, le=512, description="Nesting of arrays and objects in a request body.")
    max_tools: int = Field(64, ge=0, description="Entries of tools (their text counts in max_prompt_bytes).")
    max_tool_call_bytes: int = Field(
        16_384,
        ge=64,
        description=(
            "UTF-8 bytes of one tool call the model writes in its text (tool_choice 'auto'), held until it closes; a longer one is "
            "streamed as the text it is, not as a call. A required or named call is streamed as it is generated, whatever its length."
        ),
    )
    max_structured_output_bytes: int = Field(
        32_768,
        ge=0,
        description="UTF-8 bytes of a request's JSON schema, regex, choices or grammar (compact JSON for a schema); "
        "compile time grows with it (about 0.5 s for 40 KB of schema on one core), and llguidance's own limits bound the rest.",
    )


def utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _over(param: str, what: str, value: int, limit: int, key: str, status: int = 400) -> APIError:
    return APIError(status, f"{param}: {value} {what} is over this server's limit of {limit} ({key})", param=param, code=LIMIT_EXCEEDED)


def _check_count(param: str, what: str, value: int, limit: int, key: str) -> None:
    if value > limit:
        raise _over(param, what, value, limit, key)


def check_sampling(
    limits: RequestLimits, params: SamplingParams, choices: int, server_speculative_tokens: int, structured_param: str = "structured_outputs"
) -> None:
    """The bounds on ``params`` for a request of ``choices`` choices (prompts × n); ``structured_param``
    names the field the output constraint came from (``response_format`` or ``structured_outputs``)."""
    _check_count("n", "choices (prompts × n)", choices, limits.max_choices_per_request, "max_choices_per_request")
    _check_count("stop", "stop strings", len(params.stop), limits.max_stop_strings, "max_stop_strings")
    _check_count("stop", "bytes of stop strings", sum(map(utf8_size, params.stop)), limits.max_stop_bytes, "max_stop_bytes")
    _check_count("bad_words", "bad words", len(params.bad_words), limits.max_bad_words, "max_bad_words")
    _check_count("bad_words", "bytes of bad words", sum(map(utf8_size, params.bad_words)), limits.max_bad_words_bytes, "max_bad_words_bytes")
    _check_count("logit_bias", "entries", len(params.logit_bias), limits.max_logit_bias, "max_logit_bias")
    _check_count("allowed_token_ids", "token ids", len(params.allowed_token_ids or ()), limits.max_allowed_token_ids, "max_allowed_token_ids")
    _check_count("stop_token_ids", "token ids", len(params.stop_token_ids), limits.max_stop_token_ids, "max_stop_token_ids")
    breakers = params.dry_sequence_breakers
    _check_count("dry_sequence_breakers", "breakers", len(breakers), limits.max_dry_breakers, "max_dry_breakers")
    _check_count("dry_sequence_breakers", "bytes of breakers", sum(map(utf8_size, breakers)), limits.max_dry_breakers_bytes, "max_dry_breakers_bytes")
    negative = utf8_size(params.negative_prompt or "")
    if negative > limits.max_negative_prompt_bytes:
        raise _over("negative_prompt", "bytes", negative, limits.max_negative_prompt_bytes, "max_negative_prompt_bytes", status=413)
    entries = (params.logprobs or 0) * choices
    _check_count("logprobs", "logprob entries per step (logprobs × choices)", entries, limits.max_logprob_entries, "max_logprob_entries")
    _check_speculation(limits, params, server_speculative_tokens)
    _check_beam_search(limits, params, structured_param)
    _check_synchronous_rows(limits, params, structured_param)


def _check_beam_search(limits: RequestLimits, params: SamplingParams, structured_param: str) -> None:
    """A beam search's width, and fields that do not go with (or without) beam search."""
    if params.use_beam_search:
        _check_count("n", "beams (beam search width)", params.n, limits.max_beam_width, "max_beam_width")
    try:
        check_beam_params(params)
    except BeamSearchParamError as error:
        if error.param == "structured_outputs":
            raise APIError(400, f"{structured_param}: cannot be combined with beam search (use_beam_search)", param=structured_param) from error
        raise APIError(400, str(error), param=error.param) from error


def _check_synchronous_rows(limits: RequestLimits, params: SamplingParams, structured_param: str) -> None:
    """Output constraints and beam searches make their engine's steps synchronous: the operator may turn them off (0) or bound them."""
    if params.structured_outputs is not None and limits.max_constrained_rows == 0:
        raise APIError(
            400,
            f"{structured_param}: output constraints are off on this server (max_constrained_rows is 0; they make every step synchronous)",
            param=structured_param,
            code=LIMIT_EXCEEDED,
        )
    if params.use_beam_search:
        _check_count("n", "beams (beam search width; max_beam_rows 0 turns beam search off)", params.n, limits.max_beam_rows, "max_beam_rows")


def check_structured_outputs(limits: RequestLimits, params: SamplingParams, param: str) -> None:
    """The size of the output constraint (``param``: the field it came from), before it is compiled."""
    if params.structured_outputs is not None:
        size = params.structured_outputs.text_size()
        _check_count(param, "bytes of schema, regex, choices or grammar", size, limits.max_structured_output_bytes, "max_structured_output_bytes")


def _check_speculation(limits: RequestLimits, params: SamplingParams, server_speculative_tokens: int) -> None:
    """A speculating request makes its engine's steps synchronous for every request on it, so a
    client may ask for no more drafts than the server makes anyway or the operator allows."""
    asked = params.num_speculative_tokens
    allowed = max(limits.max_client_speculative_tokens, server_speculative_tokens)
    if asked is not None and asked > allowed:
        raise APIError(
            400,
            f"num_speculative_tokens: {asked} is over this server's limit of {allowed} (max_client_speculative_tokens; "
            "speculation makes the engine's steps synchronous for every request)",
            param="num_speculative_tokens",
            code=LIMIT_EXCEEDED,
        )


def check_prompts(limits: RequestLimits, prompts: list[str | list[int]], max_model_len: int) -> None:
    """Text prompts by UTF-8 size, token-id prompts by length, before anything is tokenized."""
    for prompt in prompts:
        if isinstance(prompt, str):
            size = utf8_size(prompt)
            if size > limits.max_prompt_bytes:
                raise _over("prompt", "bytes", size, limits.max_prompt_bytes, "max_prompt_bytes", status=413)
        else:
            check_context_length(len(prompt), max_model_len)


def check_context_length(num_tokens: int, max_model_len: int, param: str = "prompt") -> None:
    """400 for a prompt that leaves no room for an output token."""
    if num_tokens >= max_model_len:
        raise context_length_error(num_tokens, max_model_len, param)


def context_length_error(num_tokens: int, max_model_len: int, param: str, at_least: bool = False) -> APIError:
    """The 400 for a prompt of ``num_tokens`` tokens (``at_least``: counted only until it was over)."""
    counted = f"at least {num_tokens}" if at_least else f"{num_tokens}"
    message = f"the prompt has {counted} tokens; this model's context is {max_model_len} tokens"
    return APIError(400, message, param=param, code="context_length_exceeded")


def check_messages(limits: RequestLimits, texts: list[str], num_messages: int, num_tools: int) -> int:
    """The number of messages and of tools; chat text (messages, their tool calls, the tools) all
    together by UTF-8 size, with `MESSAGE_BYTES` per message: the bytes it returns."""
    _check_count("messages", "messages", num_messages, limits.max_messages, "max_messages")
    _check_count("tools", "tools", num_tools, limits.max_tools, "max_tools")
    size = sum(map(utf8_size, texts)) + MESSAGE_BYTES * num_messages
    if size > limits.max_prompt_bytes:
        what = f"bytes of message and tool text ({MESSAGE_BYTES} per message besides its text)"
        raise _over("messages", what, size, limits.max_prompt_bytes, "max_prompt_bytes", status=413)
    return size


def check_prompt_logprobs(limits: RequestLimits, prompts: list[list[int]], params: SamplingParams, param: str) -> None:
    """The entries a request scoring its prompts returns (``param``: the field that asked), once they are tokenized."""
    if params.prompt_logprobs is None:
        return
    entries = sum(map(len, prompts)) * (params.prompt_logprobs + 1) * params.n
    what = "prompt logprob entries (prompt tokens × (top alternatives + 1) × n)"
    _check_count(param, what, entries, limits.max_prompt_logprob_entries, "max_prompt_logprob_entries")


def check_echo(limits: RequestLimits, echo: bool, choices: int) -> None:
    if echo and choices > limits.max_echo_choices:
        raise _over("echo", "choices with echo", choices, limits.max_echo_choices, "max_echo_choices")


def check_in_flight(limits: RequestLimits, in_flight: int, choices: int) -> None:
    """503 when this replica already streams (or prepares) so many choices that ``choices`` more would pass the limit."""
    if in_flight + choices > limits.max_choices_in_flight:
        raise APIError(
            503,
            f"this server replica is streaming or preparing {in_flight} choices; {choices} more would pass its limit of "
            f"{limits.max_choices_in_flight} (max_choices_in_flight): retry later",
            code="too_many_choices_in_flight",
        )
