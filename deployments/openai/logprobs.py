"""Logprobs in OpenAI's two formats (and vLLM's ``prompt_logprobs``), from engine logprobs and detok token strings."""

from __future__ import annotations

import math
from dataclasses import dataclass

from detok import TokenString
from sampling.token_logprobs import PromptLogprobs, TokenLogprobs


@dataclass(frozen=True)
class LogprobEntry:
    """One token: its string, logprob, and the top alternatives (None for a prompt's first token, which has none)."""

    token: TokenString
    logprob: float | None
    top: list[tuple[TokenString, float]] | None


@dataclass(frozen=True)
class PromptLogprobEntries:
    """A choice's prompt logprobs: the engine's, the first token's string, and ``entries[i]`` for prompt token i + 1."""

    prompt: PromptLogprobs
    first_token: TokenString
    entries: list[LogprobEntry]


def logprob_token_ids(new_token_ids: list[int], logprobs: list[TokenLogprobs]) -> list[int]:
    """The ids whose strings the detokenizer renders: per token, itself then its top-N."""
    ids: list[int] = []
    for token_id, entry in zip(new_token_ids, logprobs):
        ids.append(token_id)
        ids.extend(entry.top_token_ids)
    return ids


def logprob_entries(logprobs: list[TokenLogprobs], strings: tuple[TokenString, ...]) -> list[LogprobEntry]:
    """Pair engine logprobs with the strings rendered for `logprob_token_ids`, in the same order."""
    entries, position = [], 0
    for entry in logprobs:
        token = strings[position]
        top = list(zip(strings[position + 1 : position + 1 + len(entry.top_token_ids)], entry.top_logprobs))
        position += 1 + len(entry.top_token_ids)
        entries.append(LogprobEntry(token, entry.logprob, top))
    return entries


def prompt_logprob_token_ids(prompt: PromptLogprobs) -> list[int]:
    """The ids whose strings the detokenizer renders: the first prompt token, then as `logprob_token_ids`."""
    return [prompt.token_ids[0], *logprob_token_ids(prompt.token_ids[1:], prompt.entries)]


def prompt_logprob_entries(prompt: PromptLogprobs, strings: tuple[TokenString, ...]) -> PromptLogprobEntries:
    """Pair prompt logprobs with the strings rendered for `prompt_logprob_token_ids`."""
    return PromptLogprobEntries(prompt, strings[0], logprob_entries(prompt.entries, strings[1:]))


def vllm_prompt_logprobs(scored: PromptLogprobEntries, num_top: int) -> list[dict[str, dict[str, object]] | None]:
    """vLLM's ``prompt_logprobs``: None for the first token, then per token a map from token id to
    logprob, rank and string, holding the token itself and the top ``num_top``."""
    result: list[dict[str, dict[str, object]] | None] = [None]
    for token_id, scores, entry in zip(scored.prompt.token_ids[1:], scored.prompt.entries, scored.entries):
        ranked = {str(token_id): _vllm_logprob(scores.logprob, scores.rank, entry.token)}
        for rank, (top_id, (string, logprob)) in enumerate(zip(scores.top_token_ids[:num_top], (entry.top or [])[:num_top]), start=1):
            ranked.setdefault(str(top_id), _vllm_logprob(logprob, rank, string))
        result.append(ranked)
    return result


def _vllm_logprob(logprob: float, rank: int, token: TokenString) -> dict[str, object]:
    return {"logprob": _finite(logprob), "rank": rank, "decoded_token": token.text}


def echo_entries(scored: PromptLogprobEntries, num_top: int) -> list[LogprobEntry]:
    """The prompt's tokens as the first entries of an echo's ``logprobs``: the first has no logprob."""
    return [LogprobEntry(scored.first_token, None, None)] + [LogprobEntry(e.token, e.logprob, (e.top or [])[:num_top]) for e in scored.entries]


def chat_logprobs(entries: list[LogprobEntry]) -> dict[str, object]:
    def item(token: TokenString, logprob: float) -> dict[str, object]:
        return {"token": token.text, "logprob": _finite(logprob), "bytes": list(token.bytes)}

    return {"content": [item(e.token, e.logprob) | {"top_logprobs": [item(t, lp) for t, lp in e.top]} for e in entries]}


def completion_logprobs(entries: list[LogprobEntry], text_offset: int) -> dict[str, object]:
    """``text_offset``: where the first token starts in the choice's text."""
    offsets = []
    for entry in entries:
        offsets.append(text_offset)
        text_offset += len(entry.token.text)
    return {
        "tokens": [e.token.text for e in entries],
        "token_logprobs": [None if e.logprob is None else _finite(e.logprob) for e in entries],
        "top_logprobs": [None if e.top is None else {t.text: _finite(lp) for t, lp in e.top} for e in entries],
        "text_offset": offsets,
    }


LOWEST_LOGPROB = -9999.0
"""What a logprob of -inf (a masked token) is reported as: vLLM's floor."""


def _finite(value: float) -> float | None:
    """A logprob as JSON has it, as vLLM writes it: -inf as `LOWEST_LOGPROB`, NaN as null (JSON has neither)."""
    return None if math.isnan(value) else max(value, LOWEST_LOGPROB)
