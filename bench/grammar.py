"""Grammar engines compared on the default model's tokenizer: xgrammar against llguidance.

For each engine that is installed: the one-off tokenizer preparation, the compile time of a
realistic JSON schema (cold: nothing cached), and per decoding step at batch 1, 32 and 256 the
time to fill every row's next-token bitmask (the engine's own batched, threaded call) and to
advance every matcher by one token, as wall time and as CPU time of the whole process (all
threads). Every matcher walks the tokens of one valid instance of the schema. The installed
size of each engine with the dependencies it adds to Spout's is listed beside it.

    python -m bench.grammar [--steps N]

Writes bench/results/grammar.json.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bench.lib.common import print_table, quietness, write_results
from engine.loader.model_files import load_tokenizer
from engine.tokenizer import TextTokenizer

BATCH_SIZES = (1, 32, 256)
SCHEMA = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{6}$"},
        "customer": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 64},
                "email": {"type": "string"},
                "vip": {"type": "boolean"},
            },
            "required": ["name", "email", "vip"],
            "additionalProperties": False,
        },
        "items": {
            "type": "array",
            "minItems": 1,
            "maxItems": 10,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string"},
                    "quantity": {"type": "integer", "minimum": 1, "maximum": 100},
                    "price": {"type": "number", "minimum": 0},
                },
                "required": ["sku", "quantity", "price"],
                "additionalProperties": False,
            },
        },
        "status": {"enum": ["pending", "paid", "shipped", "cancelled"]},
        "notes": {"type": ["string", "null"]},
    },
    "required": ["order_id", "customer", "items", "status", "notes"],
    "additionalProperties": False,
}
INSTANCE = {
    "order_id": "ABC-123456",
    "customer": {"name": "Ada Lovelace", "email": "ada@example.com", "vip": True},
    "items": [{"sku": "pen-blue", "quantity": 3, "price": 1.25}, {"sku": "notebook", "quantity": 1, "price": 4.5}],
    "status": "paid",
    "notes": None,
}
# What each engine adds to Spout's runtime dependencies (torch and triton are there already; transformers
# only among the test extras, and xgrammar imports it at run time).
ADDED_DISTRIBUTIONS = {"llguidance": ["llguidance"], "xgrammar": ["xgrammar", "apache-tvm-ffi", "transformers"]}


@dataclass
class EngineUnderTest:
    """One grammar engine behind four calls; ``matchers`` are opaque to the benchmark."""

    name: str
    setup_s: float
    compile: Callable[[], object]
    new_matcher: Callable[[object], object]
    fill: Callable[[list[object], np.ndarray], None]
    advance: Callable[[list[object], int], None]


def llguidance_engine(tokenizer: TextTokenizer, vocab_size: int) -> EngineUnderTest:
    import llguidance
    import llguidance.numpy

    started = time.perf_counter()
    ll_tokenizer = llguidance.LLTokenizer(tokenizer.tokenizer.to_str(), n_vocab=vocab_size, eos_token=list(tokenizer.eos_token_ids))
    setup_s = time.perf_counter() - started
    executor = llguidance.LLExecutor()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)

    def compile_schema() -> object:
        matcher = llguidance.LLMatcher(ll_tokenizer, grammar)
        matcher.compute_bitmask()  # the lexer is built lazily; the first mask finishes the compile
        assert not matcher.is_error(), matcher.get_error()
        return grammar

    def fill(matchers: list[object], bitmask: np.ndarray) -> None:
        llguidance.numpy.fill_next_token_bitmask_par(executor, [(m, i) for i, m in enumerate(matchers)], bitmask)

    def advance(matchers: list[object], token: int) -> None:
        results = executor.consume_token_par([(m, token) for m in matchers])
        assert all(results), matchers[0].get_error()

    return EngineUnderTest("llguidance", setup_s, compile_schema, lambda g: llguidance.LLMatcher(ll_tokenizer, g), fill, advance)


def xgrammar_engine(tokenizer: TextTokenizer, vocab_size: int) -> EngineUnderTest:
    import transformers
    import xgrammar

    started = time.perf_counter()
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer.tokenizer)
    info = xgrammar.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size, stop_token_ids=list(tokenizer.eos_token_ids))
    setup_s = time.perf_counter() - started
    batch = xgrammar.BatchGrammarMatcher()

    def compile_schema() -> object:
        return xgrammar.GrammarCompiler(info, cache_enabled=False).compile_json_schema(json.dumps(SCHEMA))

    def fill(matchers: list[object], bitmask: np.ndarray) -> None:
        batch.batch_fill_next_token_bitmask(matchers, torch.from_numpy(bitmask))

    def advance(matchers: list[object], token: int) -> None:
        assert all(xgrammar.BatchGrammarMatcher.batch_accept_token(matchers, [token] * len(matchers)))

    return EngineUnderTest("xgrammar", setup_s, compile_schema, xgrammar.GrammarMatcher, fill, advance)


def measure(engine: EngineUnderTest, tokens: list[int], vocab_size: int, steps: int) -> list[dict[str, object]]:
    started = time.perf_counter()
    compiled = engine.compile()
    compile_ms = (time.perf_counter() - started) * 1e3
    rows = []
    for batch_size in BATCH_SIZES:
        matchers = [engine.new_matcher(compiled) for _ in range(batch_size)]
        bitmask = np.zeros((batch_size, (vocab_size + 31) // 32), dtype=np.int32)
        fill_wall = fill_cpu = advance_wall = 0.0
        for token in tokens[:steps]:
            wall, cpu = time.perf_counter(), time.process_time()
            engine.fill(matchers, bitmask)
            fill_wall += time.perf_counter() - wall
            fill_cpu += time.process_time() - cpu
            assert _allows(bitmask[0], token), f"{engine.name} masks out the instance's token {token}"
            wall = time.perf_counter()
            engine.advance(matchers, token)
            advance_wall += time.perf_counter() - wall
        n = min(steps, len(tokens))
        rows.append(
            {
                "engine": engine.name,
                "batch": batch_size,
                "tokenizer_setup_ms": round(engine.setup_s * 1e3, 1),
                "schema_compile_ms": round(compile_ms, 2),
                "fill_ms_per_step": round(fill_wall / n * 1e3, 3),
                "fill_cpu_ms_per_step": round(fill_cpu / n * 1e3, 3),
                "advance_ms_per_step": round(advance_wall / n * 1e3, 3),
                "installed_mb": _installed_mb(ADDED_DISTRIBUTIONS[engine.name]),
            }
        )
    return rows


def _allows(mask_row: np.ndarray, token: int) -> bool:
    return bool((int(mask_row[token // 32]) >> (token % 32)) & 1)


def _installed_mb(distributions: list[str]) -> float:
    """Size on disk of these distributions' installed files."""
    total = 0
    for name in distributions:
        dist = importlib.metadata.distribution(name)
        total += sum(Path(dist.locate_file(f)).stat().st_size for f in dist.files or [] if Path(dist.locate_file(f)).exists())
    return round(total / 2**20, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000, help="decoding steps measured per batch size (at most the instance's tokens)")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    tokenizer = load_tokenizer("smollm2-135m-instruct")
    vocab_size = tokenizer.vocab_size
    tokens = tokenizer.encode(json.dumps(INSTANCE, separators=(",", ":")), add_special_tokens=False) + [tokenizer.eos_token_ids[0]]
    rows: list[dict[str, object]] = []
    for build in (llguidance_engine, xgrammar_engine):
        try:
            engine = build(tokenizer, vocab_size)
        except ImportError as error:
            print(f"skipping {build.__name__}: {error}")
            continue
        rows += measure(engine, tokens, vocab_size, args.steps)
    print_table(rows)
    path = write_results(
        "grammar",
        rows,
        **quietness(load_before),
        vocab_size=vocab_size,
        instance_tokens=len(tokens),
        versions={name: importlib.metadata.version(name) for name in ("llguidance", "xgrammar") if _installed(name)},
    )
    print(f"wrote {path}")


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


if __name__ == "__main__":
    main()
