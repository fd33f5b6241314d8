"""Speculative decoding by prompt lookup: tokens/s and acceptance, speculation on and off.

``python -m bench.spec [--quick] [--model M] [--device D] [--k K]`` runs two workloads on
the same engine settings in one run: ``repetitive`` (quote a given passage back) and
``open`` (free-form answers), greedy, a batch of requests each. It prints a table and
writes bench/results/spec.json with rows {device, workload, spec, tokens_per_s,
acceptance_rate, mean_accepted}; ``mean_accepted`` is accepted drafts per verification
(one request's drafts in one step), ``acceptance_rate`` accepted / drafted.
"""

from __future__ import annotations

import argparse
import time

from bench.lib.common import device_label, print_table, write_results
from engine.config import DEFAULT_MODEL, EngineConfig
from engine.core import EngineCore
from engine.loader.checkpoint import Checkpoint, load_checkpoint
from sampling.params import SamplingParams

PASSAGES = [
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness, "
    "it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, it was the season of Darkness.",
    "Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse, and nothing "
    "particular to interest me on shore, I thought I would sail about a little and see the watery part of the world.",
    "In the beginning the Universe was created. This has made a lot of people very angry and been widely regarded as a bad move.",
    "The sky above the port was the color of television, tuned to a dead channel. It was not like it was in the old days.",
]
OPEN_QUESTIONS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how vaccines train the immune system.",
    "What are three ways to save energy at home?",
    "Describe the water cycle to a ten year old.",
]


def workloads(checkpoint: Checkpoint) -> dict[str, list[list[int]]]:
    def chat(text: str) -> list[int]:
        return checkpoint.tokenizer.encode_chat([{"role": "user", "content": text}])

    return {
        "repetitive": [chat(f"Copy the following passage exactly, word for word:\n\n{passage}") for passage in PASSAGES],
        "open": [chat(question) for question in OPEN_QUESTIONS],
    }


def measure(engine: EngineCore, prompts: list[list[int]], max_tokens: int) -> dict[str, float]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    for index, prompt in enumerate(prompts):
        engine.add_request(str(index), prompt, params)
    drafted, accepted = engine.num_draft_tokens, engine.num_accepted_tokens
    generated, verifications = 0, 0
    started = time.perf_counter()
    while engine.has_unfinished_requests():
        for output in engine.step():
            generated += len(output.new_token_ids)
            verifications += output.num_draft_tokens > 0
    elapsed = time.perf_counter() - started
    drafted, accepted = engine.num_draft_tokens - drafted, engine.num_accepted_tokens - accepted
    return {
        "tokens_per_s": round(generated / elapsed, 1),
        "acceptance_rate": round(accepted / drafted, 3) if drafted else 0.0,
        "mean_accepted": round(accepted / verifications, 2) if verifications else 0.0,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer tokens per request (under a minute on CPU)")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--device", default=None)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens when speculation is on")
    args = parser.parse_args(argv)
    max_tokens = 24 if args.quick else 96
    checkpoint = load_checkpoint(args.model)
    prompts = workloads(checkpoint)
    rows = []
    for workload, batch in prompts.items():
        for spec in (0, args.k):
            config = EngineConfig(model=args.model, device=args.device, max_num_seqs=len(batch), max_model_len=512, num_speculative_tokens=spec)
            engine = EngineCore(config, checkpoint)
            measure(engine, batch[:1], 4)  # warm-up
            device = device_label(engine.runner.device)
            rows.append({"device": device, "workload": workload, "spec": spec} | measure(engine, batch, max_tokens))
    print_table(rows)
    path = write_results("spec", rows, model=args.model, max_tokens=max_tokens, batch=len(PASSAGES), quick=args.quick)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
