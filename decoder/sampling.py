"""Sampling settings and the one transform from logits to probabilities that p and q both go through.

The acceptance rule is only lossless when the target's p and the drafter's q are shaped the same
way, so temperature, top-k and top-p live here once and both sides call :func:`logits_to_probs`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How tokens are chosen; ``temperature == 0`` means greedy.

    >>> SamplingParams(temperature=0.7, top_p=0.9).greedy
    False
    >>> SamplingParams(top_p=1.5)
    Traceback (most recent call last):
    ...
    ValueError: top_p must be in (0, 1], got 1.5
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not math.isfinite(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Turn logits ``(..., V)`` into float32 probabilities ``(..., V)`` after temperature, top-k, top-p."""
    scores = logits.float() / max(params.temperature, 1e-5)
    if params.top_k > 0 and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_scores, dim=-1)
        # Drop a token once the tokens before it already cover top_p; the first always stays.
        drop = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) >= params.top_p
        sorted_scores = sorted_scores.masked_fill(drop, float("-inf"))
        scores = torch.full_like(scores, float("-inf")).scatter(-1, order, sorted_scores)
    return torch.softmax(scores, dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from a probability vector ``(V,)``."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """The next token for logits ``(V,)``: argmax when greedy, else a draw from the shaped distribution."""
    if params.greedy:
        return int(torch.argmax(logits).item())
    return sample(logits_to_probs(logits, params), generator)
