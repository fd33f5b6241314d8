"""`SamplingParams`: one validated description of how a request is sampled and stopped.

The same class is used by the HTTP API, the engine and the detokenizer. Disabled
values follow vLLM / llama.cpp: ``top_k`` 0 or -1, ``top_p`` 1, ``min_p`` 0,
``typical_p`` 1, ``top_n_sigma`` <= 0, penalties 0 (presence, frequency) or 1
(repetition), ``dry_multiplier`` 0, ``xtc_probability`` 0.

Every invalid value raises a pydantic ``ValidationError`` (a ``ValueError``) whose
message names the field. Token ids can only be checked against a vocabulary, so
``check_vocab(vocab_size)`` raises `TokenIdOutOfVocabError` naming the field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sampling.structured_outputs import StructuredOutputs

LOGIT_BIAS_LIMIT = 100.0
GREEDY_TEMPERATURE = 1e-5
"""A temperature under this is greedy (vLLM's epsilon): logits divided by less can overflow to infinities."""
MAX_LOGPROBS = 20
MAX_N = 128
MAX_INT64 = 2**63 - 1  # the sampling batch keeps integer parameters in int64 columns
MAX_SPECULATIVE_TOKENS = 16
MAX_NGRAM_SIZE = 16
# The library's own bounds on strings the engine takes as ids (tokenized once per request;
# a bad word's tokens but the last are matched against the latest outputs every step). They
# hold whatever the server's configurable limits (deployments/limits.py) are set to, which
# are tighter by default and so are the ones a client normally meets.
MAX_DRY_SEQUENCE_BREAKERS = 128
MAX_DRY_BREAKER_CHARS = 128
MAX_BAD_WORDS = 1024
MAX_BAD_WORD_CHARS = 2048


class TokenIdOutOfVocabError(ValueError):
    """A token id in the parameters is outside ``[0, vocab_size)``."""


def _finite(**kwargs: object) -> object:
    """A float `Field` that rejects NaN and infinities."""
    return Field(allow_inf_nan=False, **kwargs)


def _check_lengths(strings: list[str], max_chars: int) -> list[str]:
    longest = max(strings, key=len, default="")
    if len(longest) > max_chars:
        raise ValueError(f"each string may have at most {max_chars} characters, got one of {len(longest)}")
    return strings


class SamplingParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    n: int = Field(1, ge=1, le=MAX_N)
    temperature: float = _finite(default=1.0, ge=0.0, description=f"0 (or any value under {GREEDY_TEMPERATURE}) means greedy.")
    top_p: float = _finite(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, le=MAX_INT64, description="0 or -1 disables.")
    min_p: float = _finite(default=0.0, ge=0.0, le=1.0)
    typical_p: float = _finite(default=1.0, gt=0.0, le=1.0)
    top_n_sigma: float = _finite(default=-1.0, description="Keep logits within n standard deviations of the max; <= 0 disables.")
    presence_penalty: float = _finite(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = _finite(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = _finite(default=1.0, gt=0.0)
    dry_multiplier: float = _finite(default=0.0, ge=0.0)
    dry_base: float = _finite(default=1.75, ge=1.0)
    dry_allowed_length: int = Field(2, ge=0, le=MAX_INT64)
    dry_penalty_last_n: int = Field(-1, ge=-1, le=MAX_INT64, description="-1: the whole context; 0: disabled.")
    dry_sequence_breakers: list[str] = Field(default_factory=lambda: ["\n", ":", '"', "*"], max_length=MAX_DRY_SEQUENCE_BREAKERS)
    xtc_threshold: float = _finite(default=0.1, ge=0.0, le=1.0)
    xtc_probability: float = _finite(default=0.0, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)
    stop: list[str] = Field(default_factory=list)
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    max_tokens: int | None = Field(
        16, ge=0, description="None: until the context is full; 0: nothing generated (the prompt is only scored, see prompt_logprobs)."
    )
    min_tokens: int = Field(0, ge=0, le=MAX_INT64)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    prompt_logprobs: int | None = Field(
        None, ge=0, le=MAX_LOGPROBS, description="Logprob of every prompt token after the first, with this many top alternatives."
    )
    logit_bias: dict[int, float] = Field(default_factory=dict)
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] = Field(default_factory=list, max_length=MAX_BAD_WORDS)
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    num_speculative_tokens: int | None = Field(
        None, ge=0, le=MAX_SPECULATIVE_TOKENS, description="Tokens drafted per step by prompt lookup; 0 disables, None: the server's."
    )
    prompt_lookup_min: int | None = Field(None, ge=1, le=MAX_NGRAM_SIZE, description="Shortest n-gram matched; None: the server's.")
    prompt_lookup_max: int | None = Field(None, ge=1, le=MAX_NGRAM_SIZE, description="Longest n-gram matched; None: the server's.")
    guidance_scale: float = _finite(default=1.0, ge=-100.0, le=100.0, description="Classifier-free guidance; 1 disables.")
    negative_prompt: str | None = Field(None, description="The unconditional prompt of guidance; None: the bare BOS token.")
    structured_outputs: StructuredOutputs | None = Field(None, description="A JSON schema, regex, choice or grammar the output must match.")
    use_beam_search: bool = Field(False, description="Beam search of width n, returning the n best beams (vLLM's extra field).")
    length_penalty: float = _finite(default=1.0, description="Beam score: cumulative logprob / length ** length_penalty.")
    priority: int = Field(0, ge=-(2**63), lt=2**63, description="Lower runs first under the server's priority scheduling policy (vLLM's); 0 under fcfs.")
    early_stopping: bool | Literal["never"] = Field(
        False, description="When beam search stops: True at n finished beams; False by a heuristic; 'never' when no beam can do better."
    )

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, value: object) -> object:
        return [value] if isinstance(value, str) else ([] if value is None else value)

    @field_validator("stop", "bad_words", "dry_sequence_breakers")
    @classmethod
    def _strings_nonempty(cls, value: list[str]) -> list[str]:
        if any(s == "" for s in value):
            raise ValueError("must not contain empty strings")
        return value

    @field_validator("dry_sequence_breakers")
    @classmethod
    def _breakers_short(cls, value: list[str]) -> list[str]:
        return _check_lengths(value, MAX_DRY_BREAKER_CHARS)

    @field_validator("bad_words")
    @classmethod
    def _bad_words_short(cls, value: list[str]) -> list[str]:
        return _check_lengths(value, MAX_BAD_WORD_CHARS)

    @field_validator("logit_bias")
    @classmethod
    def _clamp_logit_bias(cls, value: dict[int, float]) -> dict[int, float]:
        for token, bias in value.items():
            if bias != bias or bias in (float("inf"), float("-inf")):
                raise ValueError(f"bias for token {token} must be a finite number, got {bias}")
        return {t: max(-LOGIT_BIAS_LIMIT, min(LOGIT_BIAS_LIMIT, b)) for t, b in value.items()}

    @field_validator("allowed_token_ids")
    @classmethod
    def _allowed_nonempty(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and not value:
            raise ValueError("must not be empty (use null to allow every token)")
        return value

    @model_validator(mode="after")
    def _check_ranges(self) -> SamplingParams:
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        if self.prompt_lookup_min is not None and self.prompt_lookup_max is not None and self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min ({self.prompt_lookup_min}) must be <= prompt_lookup_max ({self.prompt_lookup_max})")
        return self

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    def check_vocab(self, vocab_size: int) -> None:
        """Raise `TokenIdOutOfVocabError` naming the field if any token id is outside ``[0, vocab_size)``."""
        fields: dict[str, list[int]] = {
            "stop_token_ids": self.stop_token_ids,
            "logit_bias": list(self.logit_bias),
            "allowed_token_ids": self.allowed_token_ids or [],
        }
        for name, ids in fields.items():
            bad = [t for t in ids if not 0 <= t < vocab_size]
            if bad:
                raise TokenIdOutOfVocabError(f"{name}: token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
