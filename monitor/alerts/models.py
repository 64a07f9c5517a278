"""Tables of the alerting side (created by migration 0003): alerts and silences.

* ``alerts``: one row per fingerprint (rule + labels), holding its state machine: counters of
  consecutive active and clear evaluations, when it went pending, fired, resolved, whether the
  current episode was notified, the acknowledgement and recent firing times (flap detection).
* ``silences``: label matchers with a start, an end, an author and a comment.

The webhook outbox these alerts are notified through is :mod:`monitor.notify.models`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, Float, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from monitor.store.models import Base, BigId


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
