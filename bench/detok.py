"""Detokenizer benchmark: microseconds per output token, streaming one token per step.

Methods, same run, same token streams: English-like words, code and digits, with 3% of words
emoji, CJK, Korean or accented, for each decoder family:

- ``byte-level``: the default model's tokenizer (exotic words' tokens often split characters,
  which takes the exact general path; the rest takes the no-decode fast path);
- ``byte-fallback`` and ``metaspace``: SentencePiece-style tokenizers trained on the same text
  (`bench.lib.sentencepiece_like`), where exotic characters become ``<0xXX>`` runs or ``<unk>``;
  every token takes the general path (one ``decode_batch`` per step).

The methods:

- ``ours``: `detok.detokenize_batch` over all streams each step (one call per step),
  including building the items and taking the new states, as the serving layer would.
- ``decode_stream``: one ``tokenizers.decoders.DecodeStream`` per stream, ``step`` per
  token; the floor.
- ``full_redecode``: decode every stream's whole output at every step and diff. Its cost
  grows with length, so it runs on at most 8 streams and, past 1000 tokens, times 200
  evenly spaced steps; its ``us_per_token`` is the mean sampled step time per stream,
  which estimates the mean over all steps.

Each step is timed; ``us_per_token`` for ``ours`` and ``decode_stream`` is the median step
time per stream, so bursts from other work on a shared machine do not skew it; means (which
include those bursts and garbage collections) are in ``mean_us_per_token``. After setup the
process calls ``gc.freeze()``, as a server would after loading, so full collections skip
import-time objects. The first detok call builds a per-tokenizer byte table (once per
process); it is made before timing.

Usage: ``python -m bench.detok [--quick]`` (quick: 16 streams instead of 256).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import time

import tokenizers
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from bench.lib.common import quietness, write_results
from bench.lib.sentencepiece_like import train
from detok import DetokItem, detokenize_batch, initial_state
from engine.config import DEFAULT_MODEL
from engine.loader.model_files import load_tokenizer
from sampling.params import SamplingParams

LENGTHS = (100, 1000, 4000, 16000, 32000)
FAMILY_LENGTHS = {"byte-level": LENGTHS, "byte-fallback": (100, 32000), "metaspace": (100, 32000)}
STREAMS, QUICK_STREAMS = 256, 16
REDECODE_STREAMS, REDECODE_SAMPLES = 8, 200
WORDS = (
    "the of and to in is that for it as with was on be by this are from at or model token text "
    "def return if else for while class import self None True 0 1 2 3 42 100 2024 3.14 "
    "... ( ) [ ] { } = + - * / : ; , . ! ?"
).split()
EXOTIC = "😀 🎉 👍 🤗 中文 字符 日本語 한국어 café naïve — “quoted”".split()
EXOTIC_RATE = 0.03


def corpus_text(seed: int) -> str:
    """2000 words of deterministic mixed text."""
    rng = random.Random(seed)
    return "".join(rng.choice(EXOTIC if rng.random() < EXOTIC_RATE else WORDS) + ("\n" if rng.random() < 0.08 else " ") for _ in range(2000))


def corpus_ids(tokenizer: Tokenizer, count: int) -> list[int]:
    """At least ``count`` ids of deterministic mixed text."""
    ids: list[int] = []
    seed = 0
    while len(ids) < count:
        ids += tokenizer.encode(corpus_text(seed)).ids
        seed += 1
    return ids


def family_tokenizers() -> dict[str, Tokenizer]:
    text = "".join(corpus_text(1000 + n) for n in range(10))
    default = load_tokenizer(DEFAULT_MODEL).tokenizer
    return {"byte-level": default, "byte-fallback": train(text, byte_fallback=True), "metaspace": train(text, byte_fallback=False)}


def offsets(ids: list[int], length: int, streams: int) -> list[int]:
    """Where each stream starts in the shared ids (streams differ, nothing is copied)."""
    return [(s * 9973) % (len(ids) - length) for s in range(streams)]


def run_ours(tokenizer: Tokenizer, ids: list[int], starts: list[int], length: int) -> list[float]:
    """Seconds of each step: one `detokenize_batch` call over all streams."""
    params = SamplingParams(max_tokens=None)
    states = [initial_state(tokenizer, ids[max(0, s - 4) : s], params) for s in starts]
    times = []
    for i in range(length):
        begin = time.perf_counter()
        results = detokenize_batch(tokenizer, [DetokItem(st, (ids[s + i],)) for st, s in zip(states, starts)])
        states = [r.state for r in results]
        times.append(time.perf_counter() - begin)
    return times


def run_decode_stream(tokenizer: Tokenizer, ids: list[int], starts: list[int], length: int) -> list[float]:
    """Seconds of each step: one ``DecodeStream.step`` per stream."""
    streams = [DecodeStream(skip_special_tokens=True) for _ in starts]
    times = []
    for i in range(length):
        begin = time.perf_counter()
        for stream, s in zip(streams, starts):
            stream.step(tokenizer, ids[s + i])
        times.append(time.perf_counter() - begin)
    return times


def redecode_steps(length: int) -> list[int]:
    if length <= 1000:
        return list(range(1, length + 1))
    return [1 + (k * (length - 1)) // (REDECODE_SAMPLES - 1) for k in range(REDECODE_SAMPLES)]


def run_full_redecode(tokenizer: Tokenizer, ids: list[int], starts: list[int], length: int) -> list[float]:
    """Seconds of each sampled step: decode every stream's whole output so far and diff."""
    previous = [""] * len(starts)
    times = []
    for i in redecode_steps(length):
        begin = time.perf_counter()
        for n, s in enumerate(starts):
            text = tokenizer.decode(ids[s : s + i])
            _delta, previous[n] = text[len(previous[n]) :], text
        times.append(time.perf_counter() - begin)
    return times


RUNS = {"ours": run_ours, "decode_stream": run_decode_stream, "full_redecode": run_full_redecode}


def us_per_token(method: str, step_times: list[float], streams: int) -> float:
    """Median step time per stream for the flat methods (robust to other work on the machine);
    the mean for ``full_redecode``, whose step cost grows along the output."""
    step = statistics.mean(step_times) if method == "full_redecode" else statistics.median(step_times)
    return step / streams * 1e6


def check_exact(tokenizer: Tokenizer, ids: list[int]) -> None:
    """Sanity: ours reproduces the full decode on a bench stream."""
    state, text = initial_state(tokenizer, [], SamplingParams()), ""
    for i in ids:
        (result,) = detokenize_batch(tokenizer, [DetokItem(state, (i,))])
        state, text = result.state, text + result.text
    (last,) = detokenize_batch(tokenizer, [DetokItem(state, (), finished=True)])
    assert text + last.text == tokenizer.decode(ids), "ours differs from the full decode"


def summarize(rows: list[dict]) -> dict:
    """Per family: how ours grows from 100 to 32000 tokens, and ours over DecodeStream."""
    us = {(r["family"], r["method"], r["length"]): r["us_per_token"] for r in rows}
    return {
        family: {
            "ours_32000_over_100": round(us[family, "ours", 32000] / us[family, "ours", 100], 2),
            "ours_over_decode_stream": {n: round(us[family, "ours", n] / us[family, "decode_stream", n], 2) for n in lengths},
        }
        for family, lengths in FAMILY_LENGTHS.items()
    }


def print_table(rows: list[dict], summary: dict) -> None:
    us = {(r["family"], r["method"], r["length"]): r["us_per_token"] for r in rows}
    streams = {r["method"]: r["streams"] for r in rows}
    print(f"{'us/token':<42}" + "".join(f"{n:>10}" for n in LENGTHS))
    for family, lengths in FAMILY_LENGTHS.items():
        for m in RUNS:
            cells = "".join(f"{us[family, m, n]:>10.2f}" if n in lengths else f"{'':>10}" for n in LENGTHS)
            print(f"{f'{family} {m} ({streams[m]} streams)':<42}" + cells)
    for family, numbers in summary.items():
        print(f"{family}: ours 32000/100 {numbers['ours_32000_over_100']}x; ours/decode_stream {numbers['ours_over_decode_stream']}")


def run_family(tokenizer: Tokenizer, family: str, streams: int, rows: list[dict], means: dict) -> None:
    """Time every method on one family's tokenizer at its lengths; rows and means are appended."""
    lengths = FAMILY_LENGTHS[family]
    ids = corpus_ids(tokenizer, max(lengths) + 9973 * 2)
    check_exact(tokenizer, ids[:2000])  # also builds the per-tokenizer tables before timing
    for length in lengths:
        for name, run in RUNS.items():
            n = min(streams, REDECODE_STREAMS) if name == "full_redecode" else streams
            times = run(tokenizer, ids, offsets(ids, length, n), length)
            us = us_per_token(name, times, n)
            rows.append({"family": family, "method": name, "length": length, "streams": n, "us_per_token": round(us, 3)})
            means[f"{family}/{name}/{length}"] = round(statistics.mean(times) / n * 1e6, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description="Detokenizer benchmark (see module docstring).")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_STREAMS} streams instead of {STREAMS}")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    streams = QUICK_STREAMS if args.quick else STREAMS
    families = family_tokenizers()
    gc.collect()
    gc.freeze()
    rows: list[dict] = []
    means: dict[str, float] = {}
    for family, tokenizer in families.items():
        run_family(tokenizer, family, streams, rows, means)
    summary = summarize(rows)
    print_table(rows, summary)
    path = write_results(
        "detok",
        rows,
        mode="quick" if args.quick else "full",
        tokenizers=tokenizers.__version__,
        notes=__doc__.split("\n\n", 1)[1].rsplit("\n\nUsage", 1)[0],
        summary=summary,
        mean_us_per_token=means,
        **quietness(load_before),
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
