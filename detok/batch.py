"""`detokenize_batch`: one pure call advancing many requests' detokenization.

Each `DetokItem` carries one request's `DetokState` and its new ids; each `DetokResult`
the text to send, the next state, a stop hit, an error, and logprob token strings. Items
never affect each other and inputs are never modified, so a call can be retried or run
on any replica. A finished or stopped request's later items are no-ops (with ids: errors).

Tokenizer calls per batch: none for items `detok.fast` decides (the common case for byte-level
and SentencePiece-style tokenizers); for the rest one ``decode_batch`` per ``skip_special_tokens`` value in use,
plus one more per value only for items where a stop string matched inside a call that
brought several ids (to find the id that completed it).

Contract, per request, with ``full = tokenizer.decode(all output ids, skip_special_tokens)``:
the concatenated texts are always a prefix of ``full`` and equal it once the item with
``finished=True`` is processed, unless a stop string cut it short. ``spaces_between_special_tokens``
has no effect: ``tokenizers.Tokenizer.decode`` has no such option and is what this matches.
This is exact for byte-level BPE (all GGUF ``gpt2`` tokenizers). For decoders that drop the
first token's leading space (metaspace), output after a prompt keeps that space, as vLLM
does: it is ``decode(prompt tail + output)`` less the prompt tail's text.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import NamedTuple

from tokenizers import Tokenizer

from detok.answer import needs_steps, stepped_result
from detok.api import DetokItem, DetokResult, StopHit
from detok.decodes import Decodes
from detok.fast import fast_pieces_result, fast_result
from detok.incremental import Advance, advance, context_chars, final_chars, rebase_point, window_sequences
from detok.pieces import Pieces, pieces_of
from detok.state import DetokState
from detok.stop import StopMatch, earliest_stop, split_tail, stop_output
from detok.token_strings import TokenString, token_strings
from detok.vocab_bytes import VocabBytes, vocab_bytes


class _Queued(NamedTuple):
    """An item waiting for decodes: its window, rebase cut, and where its texts will be."""

    index: int
    window: tuple[int, ...]
    rebase_at: int | None
    start: int
    count: int
    logprobs_start: int


def detokenize_batch(tokenizer: Tokenizer, items: Sequence[DetokItem]) -> list[DetokResult]:
    """Advance every item; results are in item order. One item's bad input fails only that item.
    Items whose answer has not begun or reaches its limit (`detok.answer`) are advanced id by id."""
    if all(item.state.answer is None for item in items):
        return _detokenize(tokenizer, items)
    stepped = {n for n, item in enumerate(items) if needs_steps(item)}
    ordinary = iter(_detokenize(tokenizer, [item for n, item in enumerate(items) if n not in stepped]))
    detokenize = partial(_detokenize, tokenizer)
    return [stepped_result(detokenize, item) if n in stepped else next(ordinary) for n, item in enumerate(items)]


def _detokenize(tokenizer: Tokenizer, items: Sequence[DetokItem]) -> list[DetokResult]:
    """The ordinary path: every item advanced by its ids at once."""
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    table = vocab_bytes(tokenizer)
    pieces = None if table is not None else pieces_of(tokenizer)
    results: list[DetokResult] = [None] * len(items)  # type: ignore[list-item]
    decodes = Decodes()
    queued = []
    for n, item in enumerate(items):
        state, new_ids, finished, logprob_ids = item
        if not logprob_ids:
            if table is not None:
                results[n] = fast_result(state, new_ids, finished, table, vocab_size)  # type: ignore[call-overload]
            elif pieces is not None:
                results[n] = fast_pieces_result(state, new_ids, finished, pieces, vocab_size)  # type: ignore[call-overload]
            if results[n] is not None:
                continue
        error = _check(item, vocab_size)
        if error is not None:
            results[n] = DetokResult("", state, error=error)
        elif (new_ids or finished or logprob_ids) and not state.done:
            queued.append(_queue(n, item, decodes, pieces))
        else:
            results[n] = DetokResult("", state)
    decodes.run(tokenizer)
    stops: list[tuple[int, _Decoded, list[tuple[int, ...]], int]] = []
    offsets = Decodes()
    for q in queued:
        item = items[q.index]
        if q.index in decodes.failed:
            results[q.index] = DetokResult("", item.state, error=decodes.failed[q.index])
            continue
        decoded = _decoded(item, q, decodes, table, pieces)
        match = _first_match(item.state, decoded.buffer, len(item.new_token_ids))
        if match is not None and len(item.new_token_ids) > 1:
            skip = item.state.params.skip_special_tokens
            prefixes = _prefixes(item, q)
            stops.append((q.index, decoded, prefixes, offsets.add(q.index, skip, prefixes)))
        else:
            results[q.index] = _finalize(decoded, match, len(item.new_token_ids))
    if stops:
        offsets.run(tokenizer)
    for n, decoded, prefixes, start in stops:
        state = items[n].state
        if n in offsets.failed:
            results[n] = DetokResult("", state, error=offsets.failed[n])
        else:
            texts = offsets.texts[state.params.skip_special_tokens][start : start + len(prefixes)]
            results[n] = _resolve_stop(decoded, _token_ends(decoded, prefixes, texts))
    return results


class _Decoded(NamedTuple):
    """An item after its decodes ran, before the stop decision."""

    item: DetokItem
    ctx_chars: int
    pieces: Pieces | None
    advance: Advance
    buffer: str
    token_strings: tuple[TokenString, ...]


def _check(item: DetokItem, vocab_size: int) -> str | None:
    if item.state.done and item.new_token_ids:
        return "request already finished"
    for name, ids in (("token id", item.new_token_ids), ("logprob token id", item.logprob_token_ids)):
        for i in ids:
            if not (isinstance(i, int) and 0 <= i < vocab_size):
                return f"{name} {i!r} is not an int in the vocabulary [0, {vocab_size})"
    return None


def _queue(n: int, item: DetokItem, decodes: Decodes, pieces: Pieces | None) -> _Queued:
    """Queue the decodes item ``n`` needs."""
    state = item.state
    window = state.window + tuple(item.new_token_ids)
    rebase_at = rebase_point(state, window, pieces)
    seqs = window_sequences(state, window, rebase_at)
    start = decodes.add(n, state.params.skip_special_tokens, seqs)
    anchor = pieces.anchor if pieces is not None else ()
    logprobs_start = decodes.add(n, False, [(*anchor, i) for i in item.logprob_token_ids]) if item.logprob_token_ids else 0
    return _Queued(n, window, rebase_at, start, len(seqs), logprobs_start)


def _decoded(item: DetokItem, q: _Queued, decodes: Decodes, table: VocabBytes | None, pieces: Pieces | None) -> _Decoded:
    state = item.state
    texts = decodes.texts[state.params.skip_special_tokens][q.start : q.start + q.count]
    step = advance(state, q.window, q.rebase_at, texts, item.finished, pieces)
    strings: tuple[TokenString, ...] = ()
    if item.logprob_token_ids:
        lp_texts = decodes.texts[False][q.logprobs_start : q.logprobs_start + len(item.logprob_token_ids)]
        strings = tuple(token_strings(item.logprob_token_ids, lp_texts, table, pieces))
    return _Decoded(item, context_chars(state, texts), pieces, step, state.stop_tail + step.new_text, strings)


def _first_match(state: DetokState, buffer: str, num_new: int) -> StopMatch | None:
    """Earliest stop completing in the new text, if this call goes past ``min_tokens`` at all."""
    params = state.params
    if not params.stop or state.num_output_tokens + num_new <= params.min_tokens:
        return None
    return earliest_stop(buffer, params.stop, len(state.stop_tail) + 1)


def _prefixes(item: DetokItem, q: _Queued) -> list[tuple[int, ...]]:
    """Window prefixes ending after each new id but the last."""
    base = len(item.state.window)
    return [q.window[: base + i] for i in range(1, len(item.new_token_ids))]


def _token_ends(decoded: _Decoded, prefixes: list[tuple[int, ...]], prefix_texts: list[str]) -> list[int]:
    """For each new id, the buffer length whose text is final once that id is in."""
    state = decoded.item.state
    start = decoded.ctx_chars + state.pending_sent
    tail = len(state.stop_tail)
    ends = [tail + max(0, final_chars(state, decoded.ctx_chars, ids, text, decoded.pieces) - start) for ids, text in zip(prefixes, prefix_texts)]
    return [*ends, len(decoded.buffer)]


def _resolve_stop(decoded: _Decoded, ends: list[int]) -> DetokResult:
    """Find the stop that counts (completed by output id number ``min_tokens + 1`` or later, as the
    sampler bans stop ids until ``min_tokens`` are out), and how many new ids it keeps."""
    state = decoded.item.state
    first_counting = state.params.min_tokens + 1 - state.num_output_tokens  # 1-based index among the new ids
    min_end = ends[first_counting - 2] + 1 if first_counting > 1 else len(state.stop_tail) + 1
    match = earliest_stop(decoded.buffer, state.params.stop, min_end)
    if match is None:
        return _finalize(decoded, None, len(decoded.item.new_token_ids))
    return _finalize(decoded, match, next(i + 1 for i, end in enumerate(ends) if end >= match.end))


def _finalize(decoded: _Decoded, match: StopMatch | None, keep: int) -> DetokResult:
    """The result and next state, given the stop decision and how many new ids count."""
    state, finished = decoded.item.state, decoded.item.finished
    step = decoded.advance
    if match is None:
        text, tail = split_tail(decoded.buffer, len(state.stop_tail), state.params, finished)
        hit = None
    else:
        text, tail = stop_output(decoded.buffer, len(state.stop_tail), match, state.params.include_stop_str_in_output), ""
        hit = StopHit(match.stop, keep)
    done = finished or hit is not None
    new_state = DetokState(step.window, step.ctx_len, step.ctx_chars, step.pending_sent, tail, state.num_output_tokens + keep, done, state.params, state.answer)
    return DetokResult(text, new_state, hit, None, decoded.token_strings)
