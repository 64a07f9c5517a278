"""How long each step of a rollout lasts at the traffic its deployment has seen, as :mod:`monitor.proxy.rollout` judges.

At a step's share ``s`` of a workload's speculative requests the candidate serves ``s`` of them
and the current drafter ``1 - s``; the judge compares the two once each side has
``rollout.min_requests`` requests with a decode time, so at ``r`` such requests a second a
workload is judged after ``min_requests / (min(s, 1 - s) * r)`` seconds. A step lasts at least
``rollout.interval`` and advances at the first judgement after it in which a workload is judged and
every judged one passes: it lasts until its first workload is judged, and a workload slower than
that is left unjudged at that step. A step where none is judged is held an interval at a time and
rolled back after ``interval * (1 + rollout.max_holds)``; per workload, the last step also waits
for each workload no earlier step judged, as long as its holds allow.

These are estimates at the rates seen, with every judged workload passing (a failure ends a step
at once), and the judge's own cadence (``scheduler.rollout_interval``) left out.

At 480 and 40 requests per 30-minute step, 30 a side: the first step waits for prose, and extract
is judged at no step, unless per workload the last one waits for it:

>>> rates = {"prose": 480 / 1800, "extract": 40 / 1800}
>>> steps = pace(rates, (0.05, 0.25, 0.5, 1.0), 1800.0, 30, 3, False)
>>> [(s.share, s.lasts_s, round(s.reach_s["extract"]), s.judged("extract")) for s in steps]
[(0.05, 2250.0, 27000, False), (0.25, 1800.0, 5400, False), (0.5, 1800.0, 2700, False)]
>>> [s.lasts_s for s in pace(rates, (0.05, 0.25, 0.5, 1.0), 1800.0, 30, 3, True)]
[2250.0, 1800.0, 2700.0]
>>> [s.lasts_s for s in pace({"extract": 40 / 1800}, (0.05, 0.25, 0.5, 1.0), 1800.0, 30, 3, False)]
[None]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Final

# The traffic the steps are timed at: the deployment's last day, a day's cycle rather than an hour's peak or lull.
WINDOW: Final = timedelta(days=1)


@dataclass(frozen=True, slots=True)
class Step:
    """One judged step: its share, how long it lasts, and per workload the time until each side has its minimum."""

    share: float
    lasts_s: float | None  # None: no workload is judged within the longest a step may last: rolled back there
    reach_s: Mapping[str, float]  # math.inf for a workload without traffic

    def judged(self, workload: str) -> bool:
        """Is ``workload`` judged before the step ends?"""
        return self.lasts_s is not None and self.reach_s[workload] <= self.lasts_s


def longest_s(interval_s: float, max_holds: int) -> float:
    """The longest a step lasts undecided: its interval and ``max_holds`` more, then it rolls back."""
    return interval_s * (1 + max_holds)


def needed(share: float, min_requests: int) -> float:
    """Requests with a decode time a workload must have for each side to reach ``min_requests`` at ``share``."""
    return min_requests / min(share, 1.0 - share)


def pace(
    rates: Mapping[str, float], steps: Sequence[float], interval_s: float, min_requests: int, max_holds: int,
    per_workload: bool,
) -> list[Step]:  # fmt: skip
    """The judged steps (all but the last, 100 %: the promotion) at ``rates`` (requests with a decode time a
    second, per workload), up to the first where none is judged and the rollout would roll back."""
    longest = longest_s(interval_s, max_holds)
    judged: set[str] = set()
    found: list[Step] = []
    for number, share in enumerate(steps[:-1], start=1):
        reach = {w: needed(share, min_requests) / r if r > 0 else math.inf for w, r in rates.items()}
        first = min(reach.values(), default=math.inf)
        if first >= longest:
            found.append(Step(share, None, reach))
            break
        lasts = max(interval_s, first)
        waiting = [t for w, t in reach.items() if w not in judged and t > lasts]
        if per_workload and number == len(steps) - 1 and waiting:
            lasts = min(max(waiting), longest)
        step = Step(share, lasts, reach)
        judged |= {w for w in reach if step.judged(w)}
        found.append(step)
    return found
