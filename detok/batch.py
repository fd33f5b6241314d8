"""`detokenize_batch`: one pure call advancing many requests' detokenization.

Each item carries one request's `DetokState` and its new ids; each result carries the
text to send, the next state, a stop hit, an error, and logprob token strings. Items
never affect each other. Tokenizer calls per batch: one ``decode_batch`` per
``skip_special_tokens`` value in use, plus one more per value only for items where a stop
string matched inside a call that brought several ids (to find the completing id).

Contract, per request, with ``full = tokenizer.decode(all output ids, skip_special_tokens)``:
the concatenated texts are always a prefix of ``full`` and equal it once the item with
``finished=True`` is processed, unless a stop string cut it short. ``spaces_between_special_tokens``
has no effect: ``tokenizers.Tokenizer.decode`` has no such option and is what this matches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from tokenizers import Tokenizer

from detok.decodes import Decodes
from detok.incremental import Advance, Step, finish_step, plan_step, stable_end
from detok.state import DetokState
from detok.stop import StopMatch, earliest_stop, split_held, stop_output
from detok.token_strings import TokenString, token_strings


@dataclass(frozen=True, slots=True)
class DetokItem:
    """One request's input: its state, new output ids (one or many), whether the engine
    finished it, and ids (sampled and top-N) to render as `TokenString` for logprobs."""

    state: DetokState
    new_token_ids: Sequence[int]
    finished: bool = False
    logprob_token_ids: Sequence[int] = ()


@dataclass(frozen=True, slots=True)
class StopHit:
    """A stop string ended the request; keep the first ``keep_tokens`` of this call's new ids."""

    stop: str
    keep_tokens: int


@dataclass(frozen=True, slots=True)
class DetokResult:
    """One request's output. With ``error`` set, ``state`` is the input state and text is empty."""

    text: str
    state: DetokState
    stop: StopHit | None = None
    error: str | None = None
    token_strings: tuple[TokenString, ...] = ()


@dataclass(frozen=True, slots=True)
class _Decoded:
    """An item's step after its decodes ran, before the stop decision."""

    advance: Advance
    buffer: str
    token_strings: tuple[TokenString, ...]


def detokenize_batch(tokenizer: Tokenizer, items: Sequence[DetokItem]) -> list[DetokResult]:
    """Advance every item; results are in item order. One item's bad input fails only that item."""
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    results: list[DetokResult | None] = [None] * len(items)
    steps: dict[int, Step] = {}
    decodes = Decodes()
    for n, item in enumerate(items):
        error = _check(item, vocab_size)
        if error is not None:
            results[n] = DetokResult("", item.state, error=error)
        elif not (item.new_token_ids or item.finished or item.logprob_token_ids):
            results[n] = DetokResult("", item.state)
        else:
            steps[n] = plan_step(item.state, item.new_token_ids)
            decodes.add((n, "window"), item.state.skip_special_tokens, steps[n].sequences())
            if item.logprob_token_ids:
                decodes.add((n, "logprobs"), False, [[i] for i in item.logprob_token_ids])
    texts = decodes.run(tokenizer)
    need_offsets: dict[int, _Decoded] = {}
    offsets = Decodes()
    for n, step in steps.items():
        item = items[n]
        failed = decodes.failed.get((n, "window")) or decodes.failed.get((n, "logprobs"))
        if failed:
            results[n] = DetokResult("", item.state, error=failed)
            continue
        decoded = _decoded(tokenizer, item, step, texts[(n, "window")], texts.get((n, "logprobs"), []))
        match = _first_match(item.state, decoded.buffer, len(item.new_token_ids))
        if match is not None and len(item.new_token_ids) > 1:
            need_offsets[n] = decoded
            offsets.add(n, item.state.skip_special_tokens, _prefix_sequences(item, step))
        else:
            results[n] = _finalize(item, decoded, match, len(item.new_token_ids))
    prefix_texts = offsets.run(tokenizer) if need_offsets else {}
    for n, decoded in need_offsets.items():
        if n in offsets.failed:
            results[n] = DetokResult("", items[n].state, error=offsets.failed[n])
            continue
        ends = _token_ends(items[n].state, decoded, texts[(n, "window")][0], prefix_texts[n])
        results[n] = _resolve_stop(items[n], decoded, ends)
    return results  # type: ignore[return-value]


def _check(item: DetokItem, vocab_size: int) -> str | None:
    if item.state.done and item.new_token_ids:
        return "request already finished"
    for name, ids in (("token id", item.new_token_ids), ("logprob token id", item.logprob_token_ids)):
        bad = next((i for i in ids if not (isinstance(i, int) and 0 <= i < vocab_size)), None)
        if bad is not None:
            return f"{name} {bad!r} is outside the vocabulary [0, {vocab_size})"
    return None


def _decoded(
    tokenizer: Tokenizer, item: DetokItem, step: Step, window_texts: list[str], logprob_texts: list[str]
) -> _Decoded:
    advance = finish_step(step, window_texts, item.finished)
    strings = tuple(token_strings(tokenizer, item.logprob_token_ids, logprob_texts))
    return _Decoded(advance, item.state.held + advance.text, strings)


def _first_match(state: DetokState, buffer: str, num_new: int) -> StopMatch | None:
    """Earliest stop completing in the new text, if this call reaches ``min_tokens`` at all."""
    if not state.stop or state.num_output_tokens + num_new < state.min_tokens:
        return None
    return earliest_stop(buffer, state.stop, len(state.held) + 1)


def _prefix_sequences(item: DetokItem, step: Step) -> list[list[int]]:
    """Window prefixes ending after each new id but the last."""
    base = len(item.state.window)
    return [list(step.window[: base + i]) for i in range(1, len(item.new_token_ids))]


def _token_ends(state: DetokState, decoded: _Decoded, context_text: str, prefix_texts: list[str]) -> list[int]:
    """For each new id, the buffer length whose text is final once that id is in."""
    base = len(context_text)
    start = base + state.pending_sent
    held = len(state.held)
    ends = [held + max(0, stable_end(base, text, False) - start) for text in prefix_texts]
    return [*ends, len(decoded.buffer)]


def _resolve_stop(item: DetokItem, decoded: _Decoded, ends: list[int]) -> DetokResult:
    """Find the stop counting from id number ``min_tokens`` on, and how many new ids it keeps."""
    state = item.state
    first_counting = state.min_tokens - state.num_output_tokens  # 1-based index among new ids
    min_end = ends[first_counting - 2] + 1 if first_counting > 1 else len(state.held) + 1
    match = earliest_stop(decoded.buffer, state.stop, min_end)
    if match is None:
        return _finalize(item, decoded, None, len(item.new_token_ids))
    keep = next(i + 1 for i, end in enumerate(ends) if end >= match.end)
    return _finalize(item, decoded, match, keep)


def _finalize(item: DetokItem, decoded: _Decoded, match: StopMatch | None, keep: int) -> DetokResult:
    state, advance = item.state, decoded.advance
    moved = replace(state, window=advance.window, ctx_len=advance.ctx_len, pending_sent=advance.pending_sent)
    if match is not None:
        text = stop_output(decoded.buffer, match, state.include_stop_str_in_output)
        new_state = replace(moved, held="", num_output_tokens=state.num_output_tokens + keep, done=True)
        return DetokResult(text, new_state, StopHit(match.stop, keep), token_strings=decoded.token_strings)
    text, held = split_held(decoded.buffer, state.holdback, item.finished)
    new_state = replace(
        moved, held=held, num_output_tokens=state.num_output_tokens + keep, done=item.finished
    )
    return DetokResult(text, new_state, token_strings=decoded.token_strings)
