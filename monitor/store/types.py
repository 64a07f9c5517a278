"""What every room that writes or serialises the store's rows shares: a job's fence, a stored time as text."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from sqlalchemy.engine import Connection

# A job's check inside its own transaction: it raises when this replica no longer holds the
# scheduler's lease, so that a paused former leader's writes roll back (monitor.scheduler.lease).
Fence = Callable[[Connection], None]


def iso(value: datetime | None) -> str | None:
    """A stored time as JSON text (ISO 8601), null kept null."""
    return value.isoformat() if value is not None else None
