"""The detokenizer pool: a CPU Serve deployment that autoscales, and the ingress's client for it."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tokenizers import Tokenizer

from detok import DetokItem, DetokResult, detokenize_batch
from engine.loader.checkpoint import load_tokenizer

logger = logging.getLogger(__name__)


class Detokenizer:
    """Serve deployment body (options set in `deployments.app`): a pure function of its inputs."""

    def __init__(self, model: str) -> None:
        self.tokenizer = load_tokenizer(model).tokenizer

    def detokenize(self, items: list[DetokItem]) -> list[DetokResult]:
        return detokenize_batch(self.tokenizer, items)


class DetokClient:
    """Runs a step's detok batch inline when it is small, else on the pool.

    A pool call that fails (a replica died) is retried once through the handle,
    which routes it to another replica, then run inline: nothing is lost, since
    the function is pure and the states live with the caller.
    """

    def __init__(self, tokenizer: Tokenizer, pool_handle: object | None, inline_threshold: int, max_split: int) -> None:
        self.tokenizer = tokenizer
        self.pool = pool_handle
        self.inline_threshold = inline_threshold
        self.max_split = max_split
        self.inline_batches = 0
        self.pool_batches = 0

    async def detokenize(self, items: Sequence[DetokItem]) -> list[DetokResult]:
        num_tokens = sum(len(item.new_token_ids) for item in items)
        if self.pool is None or num_tokens < self.inline_threshold:
            self.inline_batches += 1
            return detokenize_batch(self.tokenizer, items)
        self.pool_batches += 1
        parts = _split(list(items), self.max_split)
        results: list[DetokResult] = []
        for part, responses in zip(parts, [self.pool.detokenize.remote(part) for part in parts]):  # type: ignore[attr-defined]
            results.extend(await self._pool_call(part, responses))
        return results

    async def _pool_call(self, items: list[DetokItem], response: object) -> list[DetokResult]:
        try:
            return await response  # type: ignore[misc]
        except Exception as error:
            logger.warning("detok pool call failed (%s); retrying", error)
        try:
            return await self.pool.detokenize.remote(items)  # type: ignore[attr-defined]
        except Exception as error:
            logger.warning("detok pool retry failed (%s); detokenizing inline", error)
            return detokenize_batch(self.tokenizer, items)


def _split(items: list[DetokItem], parts: int) -> list[list[DetokItem]]:
    size = -(-len(items) // max(1, parts))
    return [items[i : i + size] for i in range(0, len(items), size)]
