"""The webhook outbox (created by migration 0003 with the alert tables).

* ``notifications``: one row per receiver and notification, written in the same transaction as the
  alert change that caused it; ``notification_id`` is the stable ``webhook-id`` a receiver uses to
  drop duplicates.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from monitor.store.models import Base, BigId


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
