"""Stage 3 (sampling/README.md, "The pipeline"): repetition, presence and frequency penalties (vLLM / OpenAI semantics), at the seen tokens only."""

from __future__ import annotations

import torch


def seen_tokens(history: torch.Tensor) -> torch.Tensor:
    """[n, L] int64: ``history`` (each row's prompt and output tokens from place 0, -1 past its end) with the
    places past the end repeating the row's first token, so that every place is a seen token (all -1: none)."""
    return torch.where(history >= 0, history, history[:, :1])


def apply_penalties(
    logits: torch.Tensor,
    seen: torch.Tensor,
    counts: torch.Tensor,
    repetition: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
) -> None:
    """In place on logits [n, V]: only the tokens a row has seen change, so this costs [n, L], not [n, V].

    seen [n, L] int64: `seen_tokens` (repeats allowed); counts [n, L]: times each was generated;
    repetition / presence / frequency [n]. A seen token has a positive logit divided by, a negative
    one multiplied by, ``repetition``; then ``frequency * count + presence * (count > 0)`` is
    subtracted; a NaN that makes (``0 * inf``, a penalty past float32's range) is -inf. Every place
    of a token writes the same value, so the scatter is deterministic.
    """
    has_tokens = seen[:, :1] >= 0
    ids = seen.clamp(min=0)
    values = logits.gather(1, ids)
    rep = repetition[:, None]
    repeated = torch.where(values > 0, values / rep, values * rep)
    generated = (counts > 0).to(values.dtype)
    penalised = repeated - frequency[:, None] * counts.to(values.dtype) - presence[:, None] * generated
    penalised = penalised.masked_fill(penalised.isnan(), float("-inf"))  # 0 * inf (a penalty past float32's range) never wins
    logits.scatter_(1, ids, torch.where(has_tokens, penalised, values))
