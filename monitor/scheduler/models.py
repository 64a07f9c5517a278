"""Tables of the scheduler (created by migration 0003): the leader lease and the job history.

* ``scheduler_lease``: one row per lease name; ``epoch`` grows by one on every change of holder,
  so a write fenced with (holder, epoch) fails once another replica took over.
* ``job_runs``: one row per job and tick, unique, so a tick is claimed (and run) at most once
  whichever replica holds the lease.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Float, Index, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from monitor.store.models import Base, BigId


class LeaseRow(Base):
    """Who leads, since when, until when, and the fencing epoch."""

    __tablename__ = "scheduler_lease"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(128))
    epoch: Mapped[int] = mapped_column(BigInteger)
    acquired_at: Mapped[datetime]
    renewed_at: Mapped[datetime]
    expires_at: Mapped[datetime]


class JobRunRow(Base):
    """One execution of a scheduled job for one tick: start, end, status, error, duration."""

    __tablename__ = "job_runs"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job: Mapped[str] = mapped_column(String(32))
    tick: Mapped[datetime]
    holder: Mapped[str] = mapped_column(String(128))
    epoch: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16))  # running, ok, failed, fenced, abandoned
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    duration_s: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None]
    detail: Mapped[dict[str, Any]] = mapped_column(JSON)

    __table_args__ = (
        UniqueConstraint("job", "tick", name="uq_job_runs_job_tick"),
        Index("ix_job_runs_started", "started_at"),
    )
