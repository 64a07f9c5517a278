"""Reading and acting on alerts: list, acknowledge, the outbox's deliveries (API, commands, dashboard).

Reads return typed items; ``to_json()`` gives the API's shape of each.

>>> from monitor.store.engine import create_engine
>>> from monitor.store.migrate import upgrade
>>> engine = create_engine("sqlite://")
>>> _ = upgrade(engine)
>>> list_alerts(engine), list_notifications(engine), get_alert(engine, 1)
([], [], None)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from sqlalchemy import select, update
from sqlalchemy.engine import Engine

from monitor.alerts.models import AlertRow
from monitor.notify.models import NotificationRow
from monitor.store.types import iso

A = AlertRow
N = NotificationRow
# Listing order: what needs a person first.
STATE_ORDER: Final = ("firing", "pending", "resolved", "inactive")
SHOWN_STATES: Final = ("firing", "pending", "resolved")  # what the dashboard lists: inactive alerts never fired


@dataclass(frozen=True, slots=True)
class AlertItem:
    """One alert fingerprint and where its state machine stands."""

    id: int
    fingerprint: str
    rule: str
    severity: str
    state: str
    labels: dict[str, str]
    annotations: dict[str, str]
    value: float | None
    episode: int
    pending_since: datetime | None
    fired_at: datetime | None
    resolved_at: datetime | None
    last_eval_at: datetime
    notified: bool
    last_notified_at: datetime | None
    acked_at: datetime | None
    acked_by: str | None
    ack_comment: str | None

    @classmethod
    def of(cls, row: Any) -> AlertItem:
        return cls(
            id=row.id, fingerprint=row.fingerprint, rule=row.rule, severity=row.severity, state=row.state,
            labels=dict(row.labels or {}), annotations=dict(row.annotations or {}), value=row.value,
            episode=row.episode, pending_since=row.pending_since, fired_at=row.fired_at,
            resolved_at=row.resolved_at, last_eval_at=row.last_eval_at, notified=row.notified,
            last_notified_at=row.last_notified_at, acked_at=row.acked_at, acked_by=row.acked_by,
            ack_comment=row.ack_comment,
        )  # fmt: skip

    @property
    def summary(self) -> str:
        return str(self.annotations.get("summary", ""))

    @property
    def acknowledged(self) -> bool:
        return self.acked_at is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "fingerprint": self.fingerprint, "rule": self.rule, "severity": self.severity,
            "state": self.state, "labels": self.labels, "annotations": self.annotations, "value": self.value,
            "episode": self.episode, "pending_since": iso(self.pending_since), "fired_at": iso(self.fired_at),
            "resolved_at": iso(self.resolved_at), "last_eval_at": iso(self.last_eval_at), "notified": self.notified,
            "last_notified_at": iso(self.last_notified_at), "acknowledged": self.acknowledged,
            "acked_at": iso(self.acked_at), "acked_by": self.acked_by, "ack_comment": self.ack_comment,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class NotificationItem:
    """One outbox row, without its body."""

    id: int
    notification_id: str
    receiver: str
    format: str
    group_key: str
    status: str  # pending, delivered or dead (a dead letter: retries exhausted)
    alerts: list[dict[str, Any]]  # [{"id": alert id, "status": "firing" | "resolved"}]
    attempts: int
    created_at: datetime
    next_attempt_at: datetime
    last_status: int | None
    last_error: str | None
    delivered_at: datetime | None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "notification_id": self.notification_id, "receiver": self.receiver,
            "format": self.format, "group_key": self.group_key, "status": self.status, "alerts": self.alerts,
            "attempts": self.attempts, "created_at": iso(self.created_at),
            "next_attempt_at": iso(self.next_attempt_at), "last_status": self.last_status,
            "last_error": self.last_error, "delivered_at": iso(self.delivered_at),
        }  # fmt: skip


def list_alerts(engine: Engine, states: Sequence[str] = (), *, limit: int = 500) -> list[AlertItem]:
    """Alerts in ``states`` (all when empty): firing first, then pending, resolved, inactive; newest change first."""
    query = select(A.__table__).order_by(A.updated_at.desc(), A.id.desc()).limit(limit)
    if states:
        query = query.where(A.state.in_(list(states)))
    with engine.connect() as conn:
        items = [AlertItem.of(row) for row in conn.execute(query)]
    rank = {state: i for i, state in enumerate(STATE_ORDER)}
    return sorted(items, key=lambda a: rank.get(a.state, len(rank)))  # stable: newest first within a state


def get_alert(engine: Engine, alert_id: int) -> AlertItem | None:
    with engine.connect() as conn:
        row = conn.execute(select(A.__table__).where(A.id == alert_id)).first()
    return AlertItem.of(row) if row is not None else None


def acknowledge(engine: Engine, alert_id: int, by: str, comment: str, now: datetime) -> AlertItem | None:
    """Acknowledge a pending or firing alert: no repeats this episode (the resolved notice still goes out).

    Returns the alert, or None when it does not exist; an alert that is not pending or firing is
    returned unchanged.
    """
    with engine.begin() as conn:
        conn.execute(
            update(A)
            .where(A.id == alert_id, A.state.in_(("pending", "firing")))
            .values(acked_at=now, acked_by=by[:200], ack_comment=comment[:2000], updated_at=now)
        )
    return get_alert(engine, alert_id)


def list_notifications(
    engine: Engine, statuses: Sequence[str] | None = None, *, limit: int = 200
) -> list[NotificationItem]:
    """Outbox rows, newest first; ``statuses=["dead"]`` lists the dead letters."""
    columns = (N.id, N.notification_id, N.receiver, N.format, N.group_key, N.status, N.alerts, N.attempts,
               N.created_at, N.next_attempt_at, N.last_status, N.last_error, N.delivered_at)  # fmt: skip
    query = select(*columns).order_by(N.id.desc()).limit(limit)
    if statuses is not None:
        query = query.where(N.status.in_(list(statuses)))
    with engine.connect() as conn:
        return [NotificationItem(**row._mapping) for row in conn.execute(query)]
