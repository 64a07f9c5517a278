"""A candidate drafter beside the portfolio: what a rollout stages on a share of the decoder's requests.

The embedded decoder's drafters (the portfolio) record their requests under their kinds
(:data:`DRAFTER_KINDS`). A candidate drafter, named by :class:`Candidate`
(``ngram:MIN-MAX`` or ``model:MODEL``), stands beside them and serves nothing by itself: a
rollout (``draftwatch rollout start``) hands the decoder a :class:`Staging` (the store's rollout
is one) that says which share of each workload's requests the candidate serves and the name they
are recorded under. The share is drawn per request by :class:`CandidateDraw`, from a generator
of its own: the holdout's schedule (decoder/holdout.py) is the same with or without a rollout,
and a held-out request stays the portfolio's.

This module knows nothing of the store: the decoder never imports the monitor.

>>> parse_candidate("ngram:1-2")
Candidate(kind='ngram', model=None, ngram_min=1, ngram_max=2)
>>> str(parse_candidate("model:qwen-coder-0.5b")), str(parse_candidate("ngram")), parse_candidate(" ")
('model:qwen-coder-0.5b', 'ngram:1-4', None)
>>> parse_candidate("ngram:3-1")
Traceback (most recent call last):
...
ValueError: 'ngram:3-1': expected ngram:MIN-MAX with 1 <= MIN <= MAX, such as ngram:1-2
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final, Literal, Protocol

# The drafters of the portfolio, as its records name them (their kinds): a rollout's current side.
DRAFTER_KINDS: Final = ("model", "ngram")
# The controller's label of the candidate's arm: its drafter's label behind this, apart from any portfolio member's.
CANDIDATE_LABEL: Final = "candidate:"
_FORMS: Final = "ngram, ngram:MIN-MAX (prompt lookup of MIN- to MAX-grams, such as ngram:1-2) or model:MODEL"


@dataclass(frozen=True, slots=True)
class Candidate:
    """The candidate drafter: prompt lookup of ``ngram_min`` to ``ngram_max``-grams, or the draft ``model``."""

    kind: Literal["model", "ngram"]
    model: str | None = None
    ngram_min: int = 1
    ngram_max: int = 4

    def __str__(self) -> str:
        return f"model:{self.model}" if self.kind == "model" else f"ngram:{self.ngram_min}-{self.ngram_max}"


def parse_candidate(raw: object) -> Candidate | None:
    """A :class:`Candidate` from its text (the setting ``decoder.candidate``), None for an empty one."""
    if not isinstance(raw, str):
        raise ValueError(f"expected a text: {_FORMS}")
    text = raw.strip()
    if not text:
        return None
    kind, colon, rest = text.partition(":")
    if kind == "ngram":
        if not colon:
            return Candidate("ngram")
        low, _, high = rest.partition("-")
        if not (low.strip().isdigit() and high.strip().isdigit() and 1 <= int(low) <= int(high)):
            raise ValueError(f"{text!r}: expected ngram:MIN-MAX with 1 <= MIN <= MAX, such as ngram:1-2")
        return Candidate("ngram", ngram_min=int(low), ngram_max=int(high))
    if kind == "model" and rest.strip():
        return Candidate("model", model=rest.strip())
    raise ValueError(f"{text!r}: expected {_FORMS}")


class Staging(Protocol):
    """A rollout as the decoder sees it: the candidate's share of each workload and its recorded name.

    :class:`monitor.store.rollouts.Rollout` is one; the decoder reads nothing else of it.
    """

    @property
    def drafter(self) -> str: ...

    def share(self, workload: str) -> float: ...


class CandidateDraw:
    """Which requests the candidate serves: each with the rollout's share of its workload, independently.

    >>> class Half:
    ...     drafter = "ngram-wide"
    ...     def share(self, workload: str) -> float:
    ...         return 0.5 if workload == "copy" else 0.0
    >>> draw = CandidateDraw(seed=0)
    >>> served = [draw.draw(Half(), "copy") for _ in range(1000)]
    >>> 450 < served.count("ngram-wide") < 550, {draw.draw(Half(), "chat") for _ in range(100)}
    (True, {None})
    >>> draw.draw(None, "copy") is None
    True
    """

    def __init__(self, seed: int | None = None) -> None:
        # None: seeded by the process (os.urandom), so that a restarted or second server draws its own requests.
        self._rng = random.Random(seed)

    def draw(self, staging: Staging | None, workload: str) -> str | None:
        """The name the request is recorded under when the candidate serves it; None: the portfolio serves it."""
        if staging is None:
            return None
        return staging.drafter if self._rng.random() < staging.share(workload) else None
