"""What the window-against-window tests share: an effect floor, a minimum sample and bootstrap settings.

Each test (acceptance, acceptance length, latency, prompt length, traffic mix) is its own class
with a ``compare(ref, cur)``; this base only holds and checks the settings they all take, so that
a bad value is refused when the test is built, with its name and value, not deep in a run.

>>> from monitor.drift.detectors.acceptance import AcceptanceDrift
>>> AcceptanceDrift().floor, AcceptanceDrift(floor=0.02).floor
(0.05, 0.02)
>>> AcceptanceDrift(ci_level=95)
Traceback (most recent call last):
...
ValueError: ci_level must be in (0, 1), got 95
"""

from __future__ import annotations

from typing import ClassVar

from monitor.drift.result import DriftResult, insufficient


class WindowedTest:
    """Settings of a two-window test; subclasses set ``test``, ``metric`` and ``default_floor``.

    Parameters
    ----------
    floor : float, optional
        Smallest effect worth an alarm, in the test's effect unit (default: the test's own).
    min_requests : int
        Fewer requests than this in either window gives ``insufficient_data``.
    n_boot : int
        Bootstrap resamples for the effect's confidence interval.
    ci_level : float
        Confidence level of that interval, in (0, 1).
    """

    test: ClassVar[str]
    metric: str
    default_floor: ClassVar[float]

    def __init__(
        self, *, floor: float | None = None, min_requests: int = 30, n_boot: int = 500, ci_level: float = 0.95
    ) -> None:
        floor = self.default_floor if floor is None else floor
        if not floor >= 0:
            raise ValueError(f"floor must be >= 0, got {floor!r}")
        if min_requests < 2:
            raise ValueError(f"min_requests must be >= 2, got {min_requests!r}")
        if n_boot < 1:
            raise ValueError(f"n_boot must be >= 1, got {n_boot!r}")
        if not 0 < ci_level < 1:
            raise ValueError(f"ci_level must be in (0, 1), got {ci_level!r}")
        self.floor = floor
        self.min_requests = min_requests
        self.n_boot = n_boot
        self.ci_level = ci_level

    def too_few(self, n_ref: int, n_cur: int) -> DriftResult | None:
        """The ``insufficient_data`` result when a window is below the minimum, else None."""
        if min(n_ref, n_cur) < self.min_requests:
            return insufficient(self.test, self.metric, n_ref, n_cur, self.min_requests)
        return None
