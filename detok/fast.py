"""The common case, decided from the byte table with no tokenizer call and few objects.

It applies when the tokenizer is byte-level (``table`` given), new ids arrived, no logprob
strings are asked for, and the bytes of the pending and new ids are valid UTF-8, possibly
but for an incomplete character at the end (held pending unless the request finished).
Valid UTF-8 decodes the same strictly as lossily, so the text is exactly what
``Tokenizer.decode`` gives. A completing stop string, too many pending ids, or anything
else returns ``None`` and takes the general path in `detok.batch`, whose result this one
equals (same text, same next state). Written for speed: the state is unpacked once.
"""

from __future__ import annotations

from collections.abc import Sequence

from detok.api import DetokResult
from detok.incremental import MAX_PENDING
from detok.state import CONTEXT_TOKENS, DetokState
from detok.stop import earliest_stop
from detok.vocab_bytes import VocabBytes

INCOMPLETE = "unexpected end of data"


def fast_result(state: DetokState, new_ids: Sequence[int], finished: bool, table: VocabBytes, vocab_size: int) -> DetokResult | None:
    """The result for one item in the common case, else ``None``."""
    window, ctx_len, ctx_chars, pending_sent, old_held, num, done, params = state
    if done or ctx_chars is None or not new_ids:
        return None
    for i in new_ids:
        if not (isinstance(i, int) and 0 <= i < vocab_size):
            return None
    pending = window[ctx_len:] + tuple(new_ids) if len(window) > ctx_len else tuple(new_ids)
    if len(pending) > MAX_PENDING:
        return None
    vocab = table.skipped if params.skip_special_tokens else table.bytes
    data = vocab[pending[0]] if len(pending) == 1 else b"".join([vocab[i] for i in pending])
    try:
        decoded, complete = data.decode(), True
    except UnicodeDecodeError as error:
        if finished or error.reason != INCOMPLETE or error.end != len(data):
            return None
        decoded, complete = data[: error.start].decode(), False
    text, held = decoded[pending_sent:], ""
    if params.stop:
        text = old_held + text
        if num + len(new_ids) > params.min_tokens and earliest_stop(text, params.stop, len(old_held) + 1):
            return None
        if not finished:
            cut = max(0, len(text) - params.holdback)
            text, held = text[:cut], text[cut:]
    num += len(new_ids)
    if not complete:
        next_state = DetokState(window + tuple(new_ids), ctx_len, ctx_chars, len(decoded), held, num, False, params)
    elif len(pending) <= CONTEXT_TOKENS:
        next_state = DetokState(pending, len(pending), len(decoded), 0, held, num, finished, params)
    else:
        context = pending[-CONTEXT_TOKENS:]
        next_state = DetokState(context, len(context), None, 0, held, num, finished, params)
    return DetokResult(text, next_state)
