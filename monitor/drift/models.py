"""Tables of the drift side (created by migration 0002): runs, results, pinned baselines, detector state.

They share :class:`monitor.store.models.Base` and its naming convention with the store's tables.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, Float, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from monitor.store.models import Base, BigId


class DriftRunRow(Base):
    """One drift run: when it ran, its default windows and its parameters."""

    __tablename__ = "drift_runs"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(36), unique=True)
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime]
    ref_start: Mapped[datetime]
    ref_end: Mapped[datetime]
    cur_start: Mapped[datetime]
    cur_end: Mapped[datetime]
    level: Mapped[float] = mapped_column(Float)
    n_results: Mapped[int] = mapped_column(Integer)
    n_drift: Mapped[int] = mapped_column(Integer)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    # The acceptance split's JSON (monitor/drift/explain.py), NULL for runs stored before migration 0020.
    acceptance_split: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # The same split of decode time per token, NULL for runs stored before migration 0022.
    speed_split: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # The ledger's rates the scheduler computed after this run, for the sidecars' counters
    # (monitor.drift.detectors.ledger_rates).
    ledger_rates: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class DriftResultRow(Base):
    """One test result of a run; the windows are the ones this test actually compared."""

    __tablename__ = "drift_results"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(36))
    created_at: Mapped[datetime]
    test: Mapped[str] = mapped_column(String(32))
    workload: Mapped[str | None] = mapped_column(String(64))
    pair: Mapped[str | None]
    metric: Mapped[str] = mapped_column(String(64))
    ref_start: Mapped[datetime | None]
    ref_end: Mapped[datetime | None]
    cur_start: Mapped[datetime | None]
    cur_end: Mapped[datetime | None]
    n_ref: Mapped[int] = mapped_column(Integer)
    n_cur: Mapped[int] = mapped_column(Integer)
    statistic: Mapped[float | None] = mapped_column(Float)
    p: Mapped[float | None] = mapped_column(Float)
    q: Mapped[float | None] = mapped_column(Float)
    effect: Mapped[float | None] = mapped_column(Float)
    ci_low: Mapped[float | None] = mapped_column(Float)
    ci_high: Mapped[float | None] = mapped_column(Float)
    decision: Mapped[str] = mapped_column(String(24))
    note: Mapped[str | None]
    detail: Mapped[dict[str, Any]] = mapped_column(JSON)

    __table_args__ = (
        Index("ix_drift_results_run_id", "run_id"),
        Index("ix_drift_results_workload_test_created", "workload", "test", "created_at"),
    )


class DriftBaselineRow(Base):
    """A pinned reference window for one workload; the newest active row wins."""

    __tablename__ = "drift_baselines"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    workload: Mapped[str] = mapped_column(String(64))
    ref_start: Mapped[datetime]
    ref_end: Mapped[datetime]
    created_at: Mapped[datetime]
    active: Mapped[bool] = mapped_column(Boolean)

    __table_args__ = (Index("ix_drift_baselines_workload", "workload"),)


class DetectorStateRow(Base):
    """Persisted state of an online detector per workload and pair, with the last request it saw."""

    __tablename__ = "drift_detector_state"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    detector: Mapped[str] = mapped_column(String(32))
    workload: Mapped[str] = mapped_column(String(64))
    pair: Mapped[str]
    state: Mapped[dict[str, Any]] = mapped_column(JSON)
    last_ts: Mapped[datetime | None]
    last_id: Mapped[int | None] = mapped_column(BigId)
    updated_at: Mapped[datetime]

    __table_args__ = (UniqueConstraint("detector", "workload", "pair", name="uq_drift_detector_state_key"),)
