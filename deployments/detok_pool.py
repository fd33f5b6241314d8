"""The detokenizer pool: a CPU Serve deployment that autoscales, and the ingress's client for it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from ray.serve.config import AutoscalingContext
from ray.serve.handle import DeploymentHandle
from tokenizers import Tokenizer

from detok import DetokItem, DetokResult, detokenize_batch
from engine.loader.model_files import load_tokenizer

logger = logging.getLogger(__name__)

FANOUT_METRIC = "step_fanout"
"""Custom autoscaling metric: how many pool calls the widest recent step was split into."""
POOL_CALL_TIMEOUT_S = 10.0  # a call not answered by then is retried, then done inline


class Detokenizer:
    """Serve deployment body (options set in `deployments.app`): a pure function of its inputs."""

    def __init__(self, model: str) -> None:
        self.tokenizer = load_tokenizer(model).tokenizer
        detokenize_batch(self.tokenizer, ())  # builds the tokenizer's tables now, not in a request
        self.widest_fanout = 0

    def detokenize(self, items: list[DetokItem], fanout: int = 1) -> list[DetokResult]:
        """``fanout``: the number of pool calls this call's engine step was split into."""
        self.widest_fanout = max(self.widest_fanout, fanout)
        return detokenize_batch(self.tokenizer, items)

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve calls this periodically; the widest fan-out served since the last call."""
        widest, self.widest_fanout = self.widest_fanout, 0
        return {FANOUT_METRIC: widest}


def fanout_autoscaling_policy(ctx: AutoscalingContext) -> tuple[float, dict]:
    """One replica per pool call of the widest recent step, so a step's calls run side by side.

    Load shows as width: a step's batch is split into calls of at most
    ``detok_tokens_per_call`` tokens, so more streams mean more calls per step. Serve
    applies the min / max bounds and the upscale / downscale delays.
    """
    widest = (ctx.aggregated_metrics or {}).get(FANOUT_METRIC, {})
    return max(widest.values(), default=0.0), {}


class DetokClient:
    """Runs a step's detok batch inline when it is small (new tokens and logprob strings), else on
    the pool in calls of at most ``tokens_per_call`` new tokens, all at once.

    A pool call that fails (a replica died) is retried once through the handle,
    which routes it to another replica, then run inline: nothing is lost, since
    the function is pure and the states live with the caller.
    """

    def __init__(self, tokenizer: Tokenizer, pool_handle: DeploymentHandle[Detokenizer] | None, inline_threshold: int, tokens_per_call: int) -> None:
        self.tokenizer = tokenizer
        detokenize_batch(tokenizer, ())  # builds the tokenizer's tables now, not in a request
        self.pool = pool_handle
        self.inline_threshold = inline_threshold
        self.tokens_per_call = tokens_per_call
        self.inline_batches = 0
        self.pool_batches = 0

    async def detokenize(self, items: Sequence[DetokItem]) -> list[DetokResult]:
        # Logprob strings cost a decode each, as tokens do: a prompt's logprobs are many at once.
        num_tokens = sum(len(item.new_token_ids) + len(item.logprob_token_ids) for item in items)
        if self.pool is None or num_tokens < self.inline_threshold:
            self.inline_batches += 1
            return detokenize_batch(self.tokenizer, items)
        self.pool_batches += 1
        parts = split_by_tokens(items, self.tokens_per_call)
        responses = [self.pool.detokenize.remote(part, len(parts)) for part in parts]
        results: list[DetokResult] = []
        for part, response in zip(parts, responses):
            results.extend(await self._pool_call(self.pool, part, response, len(parts)))
        return results

    async def _pool_call(self, pool: DeploymentHandle[Detokenizer], items: list[DetokItem], response: object, fanout: int) -> list[DetokResult]:
        try:
            return await asyncio.wait_for(response, POOL_CALL_TIMEOUT_S)  # type: ignore[arg-type]
        except Exception as error:
            logger.warning("detok pool call failed (%s); retrying", error)
        try:
            return await asyncio.wait_for(pool.detokenize.remote(items, fanout), POOL_CALL_TIMEOUT_S)
        except Exception as error:
            logger.warning("detok pool retry failed (%s); detokenizing inline", error)
            return detokenize_batch(self.tokenizer, items)


def split_by_tokens(items: Sequence[DetokItem], tokens_per_part: int) -> list[list[DetokItem]]:
    """Consecutive parts of about equal size, each of at most ``tokens_per_part`` new tokens
    unless one item alone has more."""
    total = sum(len(item.new_token_ids) for item in items)
    num_parts = max(1, -(-total // tokens_per_part))
    target = -(-total // num_parts)
    parts: list[list[DetokItem]] = [[]]
    size = 0
    for item in items:
        if parts[-1] and size + len(item.new_token_ids) > target:
            parts.append([])
            size = 0
        parts[-1].append(item)
        size += len(item.new_token_ids)
    return parts
