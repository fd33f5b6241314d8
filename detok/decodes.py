"""Collect many requests' decodes and run them as one ``decode_batch`` per skip flag."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from tokenizers import Tokenizer


class Decodes:
    """Id sequences to decode, grouped by ``skip_special_tokens``, each owned by a request key.

    `run` makes one tokenizer call per flag used; if a call fails, the group is retried one
    owner at a time so that a bad owner fails alone (its key lands in ``failed``).
    """

    def __init__(self) -> None:
        self._groups: dict[bool, list[tuple[Hashable, list[list[int]]]]] = {}
        self.failed: dict[Hashable, str] = {}

    def add(self, key: Hashable, skip_special_tokens: bool, sequences: list[list[int]]) -> None:
        """Queue ``sequences`` for ``key``; `run` returns their texts under that key."""
        self._groups.setdefault(skip_special_tokens, []).append((key, sequences))

    def run(self, tokenizer: Tokenizer) -> dict[Hashable, list[str]]:
        """Decode everything queued; failed owners are absent from the result."""
        out: dict[Hashable, list[str]] = {}
        for skip, owners in self._groups.items():
            flat = [seq for _, seqs in owners for seq in seqs]
            try:
                texts = tokenizer.decode_batch(flat, skip_special_tokens=skip)
            except Exception:  # noqa: BLE001 - isolate whichever owner made the tokenizer fail
                self._run_one_by_one(tokenizer, skip, owners, out)
                continue
            _spread(owners, texts, out)
        return out

    def _run_one_by_one(
        self, tokenizer: Tokenizer, skip: bool, owners: Sequence[tuple[Hashable, list[list[int]]]], out: dict
    ) -> None:
        for key, seqs in owners:
            try:
                out[key] = tokenizer.decode_batch(seqs, skip_special_tokens=skip)
            except Exception as exc:  # noqa: BLE001 - reported as this request's error
                self.failed[key] = f"tokenizer error: {exc}"


def _spread(owners: Sequence[tuple[Hashable, list[list[int]]]], texts: list[str], out: dict) -> None:
    pos = 0
    for key, seqs in owners:
        out[key] = texts[pos : pos + len(seqs)]
        pos += len(seqs)
