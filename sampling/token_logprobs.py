"""What a request's logprobs are once on the host: plain values, no torch.

The engine reports them (`engine.outputs.EngineOutput`); the OpenAI wire format writes them
(`deployments.openai.logprobs`), which imports neither the engine nor torch.
"""

from __future__ import annotations

from typing import NamedTuple


class TokenLogprobs(NamedTuple):
    """A generated token's logprob and rank, and the request's top-N alternatives."""

    logprob: float
    rank: int
    top_token_ids: list[int]
    top_logprobs: list[float]


class PromptLogprobs(NamedTuple):
    """What a request's first output carries: its prompt, and ``entries[i]`` for ``token_ids[i + 1]``."""

    token_ids: list[int]
    entries: list[TokenLogprobs]
