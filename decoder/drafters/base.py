"""The drafter protocol: what the decode loop needs from anything that proposes tokens.

Verification never looks inside a drafter, so a new kind is a new class here and nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from decoder.sampling import SamplingParams


@dataclass(slots=True)
class Proposal:
    """Up to gamma draft tokens, and the distributions they were drawn from when the drafter has them."""

    tokens: torch.Tensor  # (k,) int64, k <= gamma; k == 0 means "no idea this step"
    probs: torch.Tensor | None  # (k, V) shaped draft distributions q, or None for a deterministic proposal

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


class Drafter(Protocol):
    """Proposes continuations of the token sequence for the target to verify."""

    kind: str  # "model", "ngram", ...
    name: str | None  # the draft model's name, None without a model
    version: str | None

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """Start a new request whose sequence so far is ``prompt_ids``: read it now if the drafter must.

        The decoder times this apart from the proposals (the controller's prefill cost), and calls
        :meth:`propose` next with at least one token more.
        """

    def propose(
        self,
        tokens: Sequence[int],
        gamma: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Proposal:
        """Propose up to ``gamma`` tokens to follow ``tokens`` (every token so far, all final)."""
        ...

    def rollback(self, num_valid: int) -> None:
        """Forget anything computed beyond the first ``num_valid`` tokens of the sequence."""


def drafter_label(drafter: Drafter) -> str:
    """The name the controller keeps a drafter's measurements under: its kind, model and version.

    A new draft version is a new label, so its costs and acceptance are learned afresh.
    """
    identity = [part for part in (drafter.name, drafter.version) if part]
    if drafter.name and drafter.version and drafter.version.startswith(f"{drafter.name}@"):
        identity = [drafter.version]  # a preset's version already says its name
    return ":".join([drafter.kind, "@".join(identity)]) if identity else drafter.kind
