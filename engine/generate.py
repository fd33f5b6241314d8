"""Offline generation: ``python -m engine.generate "The capital of France is" --max-tokens 16``."""

from __future__ import annotations

import argparse
import logging
import sys

from engine.config import DEFAULT_MODEL, EngineConfig
from engine.core import EngineCore
from sampling.params import SamplingParams
from sampling.tokenized import tokenize_strings


def generate(engine: EngineCore, prompt_token_ids: list[int], params: SamplingParams) -> list[int]:
    """Run one request to completion and return its output token ids."""
    engine.add_request("generate", prompt_token_ids, params, tokenize_strings(params, engine.tokenizer.encode))
    output_ids: list[int] = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            output_ids.extend(output.new_token_ids)
    return output_ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("prompt")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="smollm2-135m-instruct, tiny-random, a .gguf file or a HF folder")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (the default)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the chat template")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    engine = EngineCore(EngineConfig(model=args.model, dtype=args.dtype, device=args.device, max_num_seqs=1))
    tokenizer = engine.tokenizer
    if args.chat:
        prompt_ids = tokenizer.encode_chat([{"role": "user", "content": args.prompt}])
    else:
        prompt_ids = tokenizer.encode(args.prompt)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    output_ids = generate(engine, prompt_ids, params)
    sys.stdout.write(tokenizer.decode(output_ids) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
