"""Read-only views of the alerting tables for the dashboard: alerts by state, webhook deliveries.

Writes (acknowledgement, silences) go through :mod:`monitor.alerts`' own functions; these reads
return typed rows (what the dashboard caches and tables want), newest first and capped.

>>> from monitor.db.engine import create_engine
>>> from monitor.db.migrate import upgrade
>>> engine = create_engine("sqlite://")
>>> _ = upgrade(engine)
>>> list_alerts(engine), list_notifications(engine), count_alerts(engine)
([], [], {})
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from monitor.alerts.models import AlertRow, NotificationRow

A = AlertRow
N = NotificationRow
SHOWN_STATES: Final = ("firing", "pending", "resolved")


@dataclass(frozen=True, slots=True)
class AlertItem:
    id: int
    fingerprint: str
    rule: str
    severity: str
    state: str
    labels: dict[str, str]
    summary: str
    value: float | None
    pending_since: datetime | None
    fired_at: datetime | None
    resolved_at: datetime | None
    last_eval_at: datetime
    acked_at: datetime | None
    acked_by: str | None
    ack_comment: str | None
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NotificationItem:
    id: int
    notification_id: str
    receiver: str
    format: str
    status: str  # pending, delivered or dead (a dead letter: retries exhausted)
    attempts: int
    alerts: int
    created_at: datetime
    next_attempt_at: datetime
    delivered_at: datetime | None
    last_status: int | None
    last_error: str | None


def list_alerts(engine: Engine, states: Sequence[str] = SHOWN_STATES, *, limit: int = 500) -> list[AlertItem]:
    """Alerts in ``states``: firing first, then pending, then resolved; newest change first within each."""
    order = {s: i for i, s in enumerate(states)}
    with engine.connect() as conn:
        query = select(A.__table__).where(A.state.in_(list(states))).order_by(A.updated_at.desc()).limit(limit)
        items = [
            AlertItem(
                id=r.id,
                fingerprint=r.fingerprint,
                rule=r.rule,
                severity=r.severity,
                state=r.state,
                labels=dict(r.labels or {}),
                summary=str((r.annotations or {}).get("summary", "")),
                value=r.value,
                pending_since=r.pending_since,
                fired_at=r.fired_at,
                resolved_at=r.resolved_at,
                last_eval_at=r.last_eval_at,
                acked_at=r.acked_at,
                acked_by=r.acked_by,
                ack_comment=r.ack_comment,
                annotations=dict(r.annotations or {}),
            )
            for r in conn.execute(query)
        ]
    return sorted(items, key=lambda a: (order.get(a.state, len(order)), -a.last_eval_at.timestamp(), -a.id))


def count_alerts(engine: Engine) -> dict[str, int]:
    """Alerts per state."""
    with engine.connect() as conn:
        return {state: int(n) for state, n in conn.execute(select(A.state, func.count()).group_by(A.state))}


def list_notifications(
    engine: Engine, statuses: Sequence[str] | None = None, *, limit: int = 200
) -> list[NotificationItem]:
    """Webhook deliveries, newest first; ``statuses`` e.g. ``["dead"]`` for the dead letters only."""
    query = select(
        N.id,
        N.notification_id,
        N.receiver,
        N.format,
        N.status,
        N.attempts,
        N.alerts,
        N.created_at,
        N.next_attempt_at,
        N.delivered_at,
        N.last_status,
        N.last_error,
    ).order_by(N.id.desc())
    if statuses is not None:
        query = query.where(N.status.in_(list(statuses)))
    with engine.connect() as conn:
        return [
            NotificationItem(
                id=r[0],
                notification_id=r[1],
                receiver=r[2],
                format=r[3],
                status=r[4],
                attempts=r[5],
                alerts=len(r[6] or []),
                created_at=r[7],
                next_attempt_at=r[8],
                delivered_at=r[9],
                last_status=r[10],
                last_error=r[11],
            )
            for r in conn.execute(query.limit(limit))
        ]
