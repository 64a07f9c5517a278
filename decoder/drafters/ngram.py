"""Prompt-lookup drafting: propose what followed the latest earlier occurrence of the current n-gram.

No model: proposals cost microseconds, and they are right exactly when the output copies its
input (code edits, extraction, summaries that quote).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from decoder.drafters.base import Proposal
from decoder.sampling import SamplingParams


class NgramDrafter:
    """Propose the continuation of the longest suffix n-gram (``max_n`` down to ``min_n``) seen before.

    An index from each n-gram to the position after its latest occurrence grows with the sequence,
    so a proposal is a dictionary lookup rather than a scan.

    >>> drafter = NgramDrafter(min_n=1, max_n=3)
    >>> drafter.begin([5, 6, 7, 8, 5, 6])
    >>> drafter.propose([5, 6, 7, 8, 5, 6], gamma=2, params=SamplingParams(), generator=None).tokens
    tensor([7, 8])
    """

    kind = "ngram"
    name: str | None = None
    version: str | None = None

    def __init__(self, min_n: int = 1, max_n: int = 4) -> None:
        if min_n < 1:
            raise ValueError(f"min_n must be >= 1, got {min_n!r}")
        if max_n < min_n:
            raise ValueError(f"max_n must be >= min_n={min_n}, got {max_n!r}")
        self.min_n = min_n
        self.max_n = max_n
        self._latest: dict[tuple[int, ...], int] = {}
        self._indexed_upto = 0

    def begin(self, prompt_ids: Sequence[int]) -> None:
        self._latest = {}
        self._indexed_upto = 0

    def propose(
        self,
        tokens: Sequence[int],
        gamma: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Proposal:
        self._index(tokens)
        for n in range(min(self.max_n, len(tokens) - 1), self.min_n - 1, -1):
            start = self._latest.get(tuple(tokens[-n:]))
            if start is not None:
                continuation = list(tokens[start : start + gamma])
                return Proposal(tokens=torch.tensor(continuation, dtype=torch.long), probs=None)
        return Proposal(tokens=torch.empty(0, dtype=torch.long), probs=None)

    def rollback(self, num_valid: int) -> None:
        # The index only ever covers final tokens, so there is nothing to undo.
        return None

    def _index(self, tokens: Sequence[int]) -> None:
        # Index n-grams ending before the last token, so every hit has a continuation and the
        # current suffix never matches itself.
        for end in range(max(self._indexed_upto, 1), len(tokens)):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self._latest[tuple(tokens[end - n : end])] = end
        self._indexed_upto = max(self._indexed_upto, len(tokens))
