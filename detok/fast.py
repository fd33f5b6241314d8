"""The common case, with no tokenizer call and few objects: it decides most streaming steps.

It applies when the tokenizer is byte-level (``table`` given), nothing is pending, the new
ids' bytes are valid UTF-8, no logprob strings are asked for, and no stop string completes.
Its result is exactly what the general path in `detok.batch` would return (same text, same
next state); anything else returns ``None`` and takes the general path. Written for speed:
the state is unpacked once and the bytes are decoded inline.
"""

from __future__ import annotations

from collections.abc import Sequence

from detok.api import DetokResult
from detok.state import CONTEXT_TOKENS, DetokState
from detok.stop import earliest_stop
from detok.vocab_bytes import VocabBytes


def fast_result(
    state: DetokState, new_ids: Sequence[int], finished: bool, table: VocabBytes, vocab_size: int
) -> DetokResult | None:
    """The result for one item in the common case, else ``None``."""
    window, ctx_len, ctx_chars, _, old_held, num, done, params = state
    if done or ctx_chars is None or len(window) != ctx_len or not new_ids:
        return None
    for i in new_ids:
        if not (isinstance(i, int) and 0 <= i < vocab_size):
            return None
    vocab = table.skipped if params.skip_special_tokens else table.bytes
    try:
        new_text = (vocab[new_ids[0]] if len(new_ids) == 1 else b"".join([vocab[i] for i in new_ids])).decode()
    except UnicodeDecodeError:
        return None
    text, held = new_text, ""
    if params.stop:
        text = old_held + new_text
        if num + len(new_ids) >= params.min_tokens and earliest_stop(text, params.stop, len(old_held) + 1):
            return None
        if not finished:
            cut = max(0, len(text) - params.holdback)
            text, held = text[:cut], text[cut:]
    if len(new_ids) <= CONTEXT_TOKENS:
        window, ctx_chars = tuple(new_ids), len(new_text)
    else:
        window, ctx_chars = tuple(new_ids[-CONTEXT_TOKENS:]), None
    return DetokResult(text, DetokState(window, len(window), ctx_chars, 0, held, num + len(new_ids), finished, params))
