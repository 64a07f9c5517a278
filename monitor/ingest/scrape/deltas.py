"""One interval of a counter series: the difference of two scrapes, with counter resets detected.

A counter only grows while its process lives; a value below the previous one means the engine
restarted and counted again from zero, so the interval's figure is the new value itself (what it
counted since the restart) and the interval is marked ``reset``. Never a negative figure, and never
the whole history after a restart taken as one interval's.

>>> interval({"drafts": 10.0, "draft_tokens": 30.0, "accepted_tokens": 20.0}, {0: 8.0},
...          {"drafts": 14.0, "draft_tokens": 42.0, "accepted_tokens": 27.0}, {0: 11.0})
Interval(drafts=4, draft_tokens=12, accepted_tokens=7, per_position=[3], reset=False)
>>> interval({"drafts": 10.0, "draft_tokens": 30.0, "accepted_tokens": 20.0}, {},
...          {"drafts": 2.0, "draft_tokens": 6.0, "accepted_tokens": 5.0}, {}).reset
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Interval:
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    per_position: list[int]
    reset: bool


def interval(
    before: Mapping[str, float],
    before_positions: Mapping[int, float],
    after: Mapping[str, float],
    after_positions: Mapping[int, float],
) -> Interval:
    """The counts between two scrapes of one series (``before`` empty: the series is new, nothing to count yet)."""
    pairs = [(before.get(k), after[k]) for k in ("drafts", "draft_tokens", "accepted_tokens")]
    pairs += [(before_positions.get(p), v) for p, v in after_positions.items()]
    # One counter going back is enough: the whole process restarted, every counter with it.
    reset = any(old is not None and new < old for old, new in pairs)

    def delta(old: float | None, new: float) -> int:
        return round(new) if reset else round(new - (old if old is not None else new))

    drafts, draft_tokens, accepted = (delta(old, new) for old, new in pairs[:3])
    width = max(after_positions, default=-1) + 1
    positions = [delta(before_positions.get(p), after_positions.get(p, 0.0)) for p in range(width)]
    return Interval(drafts, draft_tokens, accepted, positions, reset)
