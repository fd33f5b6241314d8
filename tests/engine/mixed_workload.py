"""A mixed workload on the tiny random model: plain greedy, shared prefixes, speculation, guidance, a seeded draw.

Prompts are long enough to span several KV blocks and be prefilled in chunks; requests join
mid-flight (one every other step), so decodes, prefill chunks and verified drafts share steps.
"""

from __future__ import annotations

import random

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.loader.checkpoint import Checkpoint
from engine.outputs import EngineOutput
from sampling.params import SamplingParams
from sampling.tokenized import tokenize_strings
from tests.engine.conftest import output_ids

MAX_TOKENS = 20
SHARED_PREFIX_TOKENS = 40
BASE_CONFIG = {"model": "tiny-random", "dtype": "float32", "max_num_seqs": 8, "max_model_len": 128, "max_num_batched_tokens": 24}


def mixed_requests() -> dict[str, tuple[list[int], SamplingParams]]:
    """Request id -> (prompt, params); seeded, the same on every call."""
    rng = random.Random(15)
    shared = [rng.randrange(3, 2000) for _ in range(SHARED_PREFIX_TOKENS)]
    cycle = [rng.randrange(3, 2000) for _ in range(7)]
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return {
        "short": ([rng.randrange(3, 2000) for _ in range(5)], greedy),
        "shared-a": (shared + [rng.randrange(3, 2000) for _ in range(9)], greedy),
        "long": ([rng.randrange(3, 2000) for _ in range(70)], greedy),
        "shared-b": (shared + [rng.randrange(3, 2000) for _ in range(23)], greedy),
        # allowed_token_ids keeps the output within the cycle's tokens, so that drafts are proposed; the
        # tail's n-grams propose drafts the model rejects (13 drafted, 7 accepted before paging)
        "speculative": (cycle * 6 + cycle[4:5] * 3 + cycle[5:], greedy.model_copy(update={"num_speculative_tokens": 3, "allowed_token_ids": cycle[:5]})),
        "guided": (shared[:20], greedy.model_copy(update={"guidance_scale": 2.0, "negative_prompt": "a list of numbers"})),
        "seeded": (shared + [7, 8, 9], SamplingParams(temperature=1.0, seed=5, max_tokens=MAX_TOKENS, ignore_eos=True)),
    }


def run_mixed(checkpoint: Checkpoint, **overrides) -> tuple[EngineCore, dict[str, list[int]]]:
    """Run `mixed_requests` on a fresh engine; the engine afterwards and each request's output ids."""
    engine = EngineCore(EngineConfig(**(BASE_CONFIG | overrides)), checkpoint)
    pending = list(mixed_requests().items())
    outputs: dict[str, list[EngineOutput]] = {}
    num_steps = 0
    while pending or engine.has_unfinished_requests():
        if pending and num_steps % 2 == 0:
            request_id, (prompt, params) = pending.pop(0)
            engine.add_request(request_id, prompt, params, tokenize_strings(params, engine.tokenizer.encode))
        for output in engine.step():
            outputs.setdefault(output.request_id, []).append(output)
        num_steps += 1
        assert num_steps < 5000
    return engine, {request_id: output_ids(request_outputs) for request_id, request_outputs in outputs.items()}
