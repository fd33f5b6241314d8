"""Logprobs in OpenAI's two formats, from engine logprobs and detok token strings."""

from __future__ import annotations

from dataclasses import dataclass

from detok import TokenString
from engine.request import TokenLogprobs


@dataclass(frozen=True)
class LogprobEntry:
    """One generated token: its string, logprob, and the top alternatives."""

    token: TokenString
    logprob: float
    top: list[tuple[TokenString, float]]


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
        "token_logprobs": [_finite(e.logprob) for e in entries],
        "top_logprobs": [{t.text: _finite(lp) for t, lp in e.top} for e in entries],
        "text_offset": offsets,
    }


def _finite(value: float) -> float:
    """JSON has no -inf: a masked token's logprob is reported as float32's lowest."""
    return max(value, -3.4028234663852886e38)
