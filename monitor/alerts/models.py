"""Tables of the alerting side (created by migration 0003): alerts, silences and the webhook outbox.

* ``alerts``: one row per fingerprint (rule + labels), holding its state machine: counters of
  consecutive active and clear evaluations, when it went pending, fired, resolved, whether the
  current episode was notified, the acknowledgement and recent firing times (flap detection).
* ``silences``: label matchers with a start, an end, an author and a comment.
* ``notifications``: the transactional outbox, one row per receiver and notification, written in
  the same transaction as the alert change that caused it; ``notification_id`` is the stable
  ``webhook-id`` a receiver uses to drop duplicates.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, Float, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from monitor.db.models import Base, BigId

ALERT_STATES = ("inactive", "pending", "firing", "resolved")
NOTIFICATION_STATES = ("pending", "delivered", "dead")


class AlertRow(Base):
    """One alert fingerprint and its state machine."""

    __tablename__ = "alerts"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    fingerprint: Mapped[str] = mapped_column(String(64), unique=True)
    rule: Mapped[str] = mapped_column(String(64))
    severity: Mapped[str] = mapped_column(String(16))
    labels: Mapped[dict[str, str]] = mapped_column(JSON)
    annotations: Mapped[dict[str, str]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16))
    episode: Mapped[int] = mapped_column(Integer)
    active_runs: Mapped[int] = mapped_column(Integer)
    clear_runs: Mapped[int] = mapped_column(Integer)
    value: Mapped[float | None] = mapped_column(Float)
    pending_since: Mapped[datetime | None]
    fired_at: Mapped[datetime | None]
    resolved_at: Mapped[datetime | None]
    last_eval_at: Mapped[datetime]
    notified: Mapped[bool] = mapped_column(Boolean)
    last_notified_at: Mapped[datetime | None]
    acked_at: Mapped[datetime | None]
    acked_by: Mapped[str | None]
    ack_comment: Mapped[str | None]
    # ISO times of the latest transitions to firing, newest last (bounded): flap detection.
    fire_times: Mapped[list[str]] = mapped_column(JSON)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]

    __table_args__ = (Index("ix_alerts_state", "state"),)


class SilenceRow(Base):
    """A silence: while ``starts_at <= now < ends_at`` (and not expired), matching alerts are not notified."""

    __tablename__ = "silences"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    matchers: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    starts_at: Mapped[datetime]
    ends_at: Mapped[datetime]
    created_by: Mapped[str]
    comment: Mapped[str]
    created_at: Mapped[datetime]
    expired_at: Mapped[datetime | None]


class NotificationRow(Base):
    """One notification to one receiver: the outbox row the delivery worker sends and retries."""

    __tablename__ = "notifications"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    notification_id: Mapped[str] = mapped_column(String(64), unique=True)
    receiver: Mapped[str] = mapped_column(String(128))
    format: Mapped[str] = mapped_column(String(16))
    group_key: Mapped[str]
    status: Mapped[str] = mapped_column(String(16))
    body: Mapped[str]
    # [{"id": alert id, "status": "firing" | "resolved"}] in the order rendered.
    alerts: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    attempts: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime]
    next_attempt_at: Mapped[datetime]
    claimed_until: Mapped[datetime | None]
    claimed_by: Mapped[str | None]
    last_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None]
    delivered_at: Mapped[datetime | None]

    __table_args__ = (
        Index("ix_notifications_status_next", "status", "next_attempt_at"),
        Index("ix_notifications_receiver_group", "receiver", "group_key", "id"),
    )
