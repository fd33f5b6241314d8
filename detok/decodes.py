"""Collect many requests' decodes and run them as one ``decode_batch`` per skip flag."""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer


class Decodes:
    """Id sequences to decode, grouped by ``skip_special_tokens``, each added by an owner (a request).

    `run` makes one tokenizer call per flag used; if a call fails, that group is retried one
    owner at a time so that only an owner whose ids make the tokenizer fail lands in ``failed``.
    """

    def __init__(self) -> None:
        self._seqs: dict[bool, list[Sequence[int]]] = {True: [], False: []}
        self._owners: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}
        self.texts: dict[bool, list[str]] = {}
        self.failed: dict[int, str] = {}

    def add(self, owner: int, skip_special_tokens: bool, sequences: Sequence[Sequence[int]]) -> int:
        """Queue ``sequences``; after `run` their decodes are ``texts[skip][start:start + len]``."""
        seqs = self._seqs[skip_special_tokens]
        start = len(seqs)
        seqs.extend(sequences)
        self._owners[skip_special_tokens].append((owner, start, len(sequences)))
        return start

    def run(self, tokenizer: Tokenizer) -> None:
        """Decode everything queued."""
        for skip, seqs in self._seqs.items():
            if not seqs:
                continue
            try:
                self.texts[skip] = tokenizer.decode_batch(seqs, skip_special_tokens=skip)
            except Exception:  # noqa: BLE001 - find which owner made the tokenizer fail
                self.texts[skip] = self._one_by_one(tokenizer, skip)

    def _one_by_one(self, tokenizer: Tokenizer, skip: bool) -> list[str]:
        texts: list[str] = []
        for owner, start, count in self._owners[skip]:
            try:
                texts += tokenizer.decode_batch(self._seqs[skip][start : start + count], skip_special_tokens=skip)
            except Exception as exc:  # noqa: BLE001 - reported as this owner's error
                self.failed[owner] = f"tokenizer error: {exc}"
                texts += [""] * count
        return texts
