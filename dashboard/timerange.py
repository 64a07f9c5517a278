"""Time ranges of the dashboard: minute-aligned, so rollup-based figures are exact for the range shown.

>>> from datetime import UTC, datetime
>>> r = time_range("Last 1 hour", datetime(2026, 3, 1, 12, 30, 45, tzinfo=UTC))
>>> r.start.isoformat(), r.end.isoformat(), r.step
('2026-03-01T11:31:00+00:00', '2026-03-01T12:31:00+00:00', datetime.timedelta(seconds=60))
>>> r.reference.start.isoformat()
'2026-03-01T10:31:00+00:00'
>>> time_range("Last 7 days", datetime(2026, 3, 1, tzinfo=UTC)).step
datetime.timedelta(seconds=5040)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

RANGES: Final = {
    "Last 15 minutes": timedelta(minutes=15),
    "Last 1 hour": timedelta(hours=1),
    "Last 6 hours": timedelta(hours=6),
    "Last 24 hours": timedelta(days=1),
    "Last 7 days": timedelta(days=7),
    "Last 30 days": timedelta(days=30),
}
DEFAULT_RANGE: Final = "Last 24 hours"
# Points per time-series chart at most: enough to see a change, few enough to draw at once.
MAX_POINTS: Final = 120


@dataclass(frozen=True, slots=True)
class TimeRange:
    """``[start, end)`` on minute boundaries; ``step`` is the time-series resolution (whole minutes)."""

    start: datetime
    end: datetime
    step: timedelta

    @property
    def span(self) -> timedelta:
        return self.end - self.start

    @property
    def reference(self) -> TimeRange:
        """The window of the same length just before this one: what "change" is measured against."""
        return TimeRange(self.start - self.span, self.start, self.step)

    def label(self) -> str:
        return f"{self.start:%Y-%m-%d %H:%M} – {self.end:%Y-%m-%d %H:%M} UTC"


def time_range(name: str, now: datetime | None = None) -> TimeRange:
    """The range called ``name`` (a key of :data:`RANGES`) ending with the current minute, inclusive."""
    span = RANGES.get(name, RANGES[DEFAULT_RANGE])
    now = now or datetime.now(UTC)
    end = now.astimezone(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
    minutes = math.ceil(span.total_seconds() / 60 / MAX_POINTS)
    return TimeRange(end - span, end, timedelta(minutes=max(1, minutes)))
