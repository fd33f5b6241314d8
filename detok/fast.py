"""The common cases, decided from per-tokenizer tables with no tokenizer call and few objects.

Byte-level tokenizers (`fast_result`): new ids arrived, no logprob strings are asked for,
and the bytes of the pending and new ids are valid UTF-8, possibly but for an incomplete
character at the end (held pending unless the request finished). Valid UTF-8 decodes the
same strictly as lossily, so the text is exactly what ``Tokenizer.decode`` gives.

SentencePiece-style tokenizers (`fast_pieces_result`): the context is the anchor, nothing
is pending and no new id is a byte-fallback id, so the text is the new ids' tabled pieces
(`detok.pieces`).

A completing stop string, too many pending ids, or anything else returns ``None`` and takes
the general path in `detok.batch`, whose result this one equals (same text, same next
state). Written for speed: the state is unpacked once.
"""

from __future__ import annotations

from collections.abc import Sequence

from detok.api import DetokResult
from detok.incremental import MAX_PENDING
from detok.pieces import Pieces
from detok.state import CONTEXT_TOKENS, DetokParams, DetokState
from detok.stop import earliest_stop, split_tail
from detok.vocab_bytes import VocabBytes

INCOMPLETE = "unexpected end of data"


def fast_result(state: DetokState, new_ids: Sequence[int], finished: bool, table: VocabBytes, vocab_size: int) -> DetokResult | None:
    """The result for one byte-level item in the common case, else ``None``."""
    window, ctx_len, ctx_chars, pending_sent, old_tail, num, done, params, answer = state
    if done or ctx_chars is None or not new_ids or not _in_vocab(new_ids, vocab_size):
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
    sent = _without_stop(decoded[pending_sent:], old_tail, num + len(new_ids), params, finished)
    if sent is None:
        return None
    text, tail = sent
    num += len(new_ids)
    if not complete:
        next_state = DetokState(window + tuple(new_ids), ctx_len, ctx_chars, len(decoded), tail, num, False, params, answer)
    elif len(pending) <= CONTEXT_TOKENS:
        next_state = DetokState(pending, len(pending), len(decoded), 0, tail, num, finished, params, answer)
    else:
        context = pending[-CONTEXT_TOKENS:]
        next_state = DetokState(context, len(context), None, 0, tail, num, finished, params, answer)
    return DetokResult(text, next_state)


def fast_pieces_result(state: DetokState, new_ids: Sequence[int], finished: bool, pieces: Pieces, vocab_size: int) -> DetokResult | None:
    """The result for one SentencePiece-style item in the common case, else ``None``."""
    window, ctx_len, ctx_chars, _, old_tail, num, done, params, answer = state
    table = pieces.skipped_piece_of_id if params.skip_special_tokens else pieces.piece_of_id
    if done or table is None or window != pieces.anchor or not new_ids or not _in_vocab(new_ids, vocab_size):
        return None
    try:
        text = table[new_ids[0]] if len(new_ids) == 1 else "".join([table[i] for i in new_ids])  # type: ignore[misc]
    except TypeError:  # a byte id's piece is None: its run takes the general path
        return None
    if text is None:
        return None
    sent = _without_stop(text, old_tail, num + len(new_ids), params, finished)
    if sent is None:
        return None
    return DetokResult(sent[0], DetokState(window, ctx_len, ctx_chars, 0, sent[1], num + len(new_ids), finished, params, answer))


def _in_vocab(ids: Sequence[int], vocab_size: int) -> bool:
    for i in ids:
        if not (isinstance(i, int) and 0 <= i < vocab_size):
            return False
    return True


def _without_stop(text: str, old_tail: str, num: int, params: DetokParams, finished: bool) -> tuple[str, str] | None:
    """Text to send and the next stop tail, or ``None`` if a stop string completes (``num``: output ids after this call)."""
    if not params.stop:
        return text, ""
    buffer = old_tail + text
    if num > params.min_tokens and earliest_stop(buffer, params.stop, len(old_tail) + 1):
        return None
    return split_tail(buffer, len(old_tail), params, finished)
