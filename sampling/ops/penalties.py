"""Stage 4: repetition, presence and frequency penalties (vLLM / OpenAI semantics)."""

from __future__ import annotations

import torch


def apply_penalties(
    logits: torch.Tensor,
    prompt_mask: torch.Tensor,
    output_counts: torch.Tensor,
    repetition: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
) -> torch.Tensor:
    """Penalised logits [n, V].

    prompt_mask [n, V] bool (token in the prompt), output_counts [n, V] int (times generated);
    repetition / presence / frequency [n]. A token seen in the prompt or the output has a
    positive logit divided by, a negative one multiplied by, ``repetition``; then
    ``frequency * count + presence * (count > 0)`` is subtracted (outputs only).
    """
    counts = output_counts.to(logits.dtype)
    generated = output_counts > 0
    rep = repetition[:, None]
    repeated = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(generated | prompt_mask, repeated, logits)
    return logits - frequency[:, None] * counts - presence[:, None] * generated.to(logits.dtype)
