"""Prompt-lookup drafting: propose the tokens that followed the latest earlier occurrence
of a request's last n tokens in its own prompt and output."""

from __future__ import annotations


class NgramIndex:
    """Where each n-gram of one token sequence (``min_n <= n <= max_n``) last occurred.

    The index is extended as the sequence grows (tokens are only ever appended), so a
    proposal costs O(max_n) per new token instead of a scan of the whole context.
    """

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n = min_n
        self.max_n = max_n
        self.tokens: list[int] = []
        self.next_position: dict[tuple[int, ...], int] = {}
        """n-gram -> the index of the token that followed its latest indexed occurrence."""

    def propose(self, new_tokens: list[int], max_tokens: int) -> list[int]:
        """Append ``new_tokens`` to the sequence; return up to ``max_tokens`` drafted continuations.

        The longest suffix n-gram with an earlier occurrence wins; its latest occurrence is used.
        """
        for token in new_tokens:
            self._index_suffixes()
            self.tokens.append(token)
        if max_tokens <= 0:
            return []
        length = len(self.tokens)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            start = self.next_position.get(tuple(self.tokens[length - n :]))
            if start is not None:
                return self.tokens[start : start + max_tokens]
        return []

    def _index_suffixes(self) -> None:
        """Record the n-grams ending at the current last token, as followed by the token about to be appended."""
        length = len(self.tokens)
        for n in range(self.min_n, min(self.max_n, length) + 1):
            self.next_position[tuple(self.tokens[length - n :])] = length
