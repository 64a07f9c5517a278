"""Reading and acting on alerts: list, acknowledge, dead letters, job history, the lease (API, CLI, dashboard)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.engine import Engine

from monitor.alerts.models import AlertRow, NotificationRow
from monitor.scheduler.models import JobRunRow, LeaseRow

ALERTS = AlertRow.__table__


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def alert_json(row: Any) -> dict[str, Any]:
    return {
        "id": row.id,
        "fingerprint": row.fingerprint,
        "rule": row.rule,
        "severity": row.severity,
        "state": row.state,
        "labels": row.labels,
        "annotations": row.annotations,
        "value": row.value,
        "episode": row.episode,
        "pending_since": _iso(row.pending_since),
        "fired_at": _iso(row.fired_at),
        "resolved_at": _iso(row.resolved_at),
        "last_eval_at": _iso(row.last_eval_at),
        "notified": row.notified,
        "last_notified_at": _iso(row.last_notified_at),
        "acknowledged": row.acked_at is not None,
        "acked_at": _iso(row.acked_at),
        "acked_by": row.acked_by,
        "ack_comment": row.ack_comment,
    }


def list_alerts(engine: Engine, *, states: tuple[str, ...] = (), limit: int = 500) -> list[dict[str, Any]]:
    """Alerts, firing first, then pending, then the rest, newest change first; all states when ``states`` is empty."""
    query = select(ALERTS).order_by(AlertRow.updated_at.desc(), AlertRow.id.desc()).limit(limit)
    if states:
        query = query.where(AlertRow.state.in_(states))
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    order = {"firing": 0, "pending": 1, "resolved": 2, "inactive": 3}
    return [alert_json(r) for r in sorted(rows, key=lambda r: order.get(r.state, 9))]


def get_alert(engine: Engine, alert_id: int) -> dict[str, Any] | None:
    with engine.connect() as conn:
        row = conn.execute(select(ALERTS).where(AlertRow.id == alert_id)).first()
    return alert_json(row) if row is not None else None


def acknowledge(engine: Engine, alert_id: int, by: str, comment: str, now: datetime) -> dict[str, Any] | None:
    """Acknowledge a pending or firing alert: no repeats this episode (the resolved notice still goes out).

    Returns the alert, or None when it does not exist; an alert that is not pending or firing is
    returned unchanged.
    """
    with engine.begin() as conn:
        conn.execute(
            update(AlertRow)
            .where(AlertRow.id == alert_id, AlertRow.state.in_(("pending", "firing")))
            .values(acked_at=now, acked_by=by[:200], ack_comment=comment[:2000], updated_at=now)
        )
    return get_alert(engine, alert_id)


def list_notifications(engine: Engine, *, status: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
    """Outbox rows (without bodies), newest first; ``status="dead"`` lists the dead letters."""
    n = NotificationRow
    cols = (n.id, n.notification_id, n.receiver, n.format, n.group_key, n.status, n.alerts, n.attempts,
            n.created_at, n.next_attempt_at, n.last_status, n.last_error, n.delivered_at)  # fmt: skip
    query = select(*cols).order_by(n.id.desc()).limit(limit)
    if status:
        query = query.where(n.status == status)
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    return [{k: (_iso(v) if isinstance(v, datetime) else v) for k, v in r._mapping.items()} for r in rows]


def list_jobs(engine: Engine, *, job: str | None = None, limit: int = 100) -> dict[str, Any]:
    """Job history, newest first, and the lease (who leads, epoch, expiry)."""
    j = JobRunRow
    query = select(JobRunRow.__table__).order_by(j.started_at.desc(), j.id.desc()).limit(limit)
    if job:
        query = query.where(j.job == job)
    with engine.connect() as conn:
        runs = conn.execute(query).all()
        lease = conn.execute(select(LeaseRow.__table__)).first()
    return {
        "lease": None if lease is None else {
            "name": lease.name, "holder": lease.holder, "epoch": lease.epoch,
            "acquired_at": _iso(lease.acquired_at), "renewed_at": _iso(lease.renewed_at),
            "expires_at": _iso(lease.expires_at),
        },
        "runs": [
            {"id": r.id, "job": r.job, "tick": _iso(r.tick), "holder": r.holder, "epoch": r.epoch,
             "status": r.status, "started_at": _iso(r.started_at), "finished_at": _iso(r.finished_at),
             "duration_s": r.duration_s, "error": r.error, "detail": r.detail}
            for r in runs
        ],
    }  # fmt: skip
