"""Test helper: drive `detokenize_batch` over chunks and record every delta."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

from detok import DetokItem, DetokResult, DetokState, detokenize_batch


@dataclass
class Stream:
    deltas: list[str]
    results: list[DetokResult]

    @property
    def text(self) -> str:
        return "".join(self.deltas)

    @property
    def final(self) -> DetokResult:
        return self.results[-1]


def stream(tokenizer: Tokenizer, state: DetokState, chunks: Sequence[Sequence[int]], finish: bool = True) -> Stream:
    """Feed ``chunks`` one call each (the last with ``finished=finish``), stopping at a stop hit."""
    out = Stream([], [])
    for n, chunk in enumerate(chunks):
        (result,) = detokenize_batch(tokenizer, [DetokItem(state, chunk, finished=finish and n == len(chunks) - 1)])
        assert result.error is None, result.error
        out.deltas.append(result.text)
        out.results.append(result)
        state = result.state
        if result.stop is not None:
            break
    return out


def split(ids: Sequence[int], sizes: Sequence[int]) -> list[list[int]]:
    """Cut ``ids`` into consecutive chunks of the given sizes (cycled), the last taking the rest."""
    chunks, pos, n = [], 0, 0
    while pos < len(ids):
        size = max(1, sizes[n % len(sizes)]) if sizes else 1
        chunks.append(list(ids[pos : pos + size]))
        pos, n = pos + size, n + 1
    return chunks


class HiddenDecoder:
    """The real tokenizer with its decoder type hidden, which forces detok's generic path."""

    decoder = None

    def __init__(self, inner: Tokenizer) -> None:
        self._inner = inner

    def __getattr__(self, name: str):
        return getattr(self._inner, name)
