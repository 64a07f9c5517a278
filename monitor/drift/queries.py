"""Reading stored drift results (API ``GET /v1/drift``, dashboard, alerts) and pinning baselines.

>>> from monitor.store.engine import create_engine
>>> from monitor.store.migrate import upgrade
>>> engine = create_engine("sqlite://")
>>> _ = upgrade(engine)
>>> latest_results(engine), latest_run(engine)
([], None)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Engine

from monitor.drift.models import DriftBaselineRow, DriftResultRow, DriftRunRow
from monitor.drift.result import DriftResult


@dataclass(frozen=True, slots=True)
class StoredRun:
    run_id: str
    started_at: datetime
    finished_at: datetime
    n_results: int
    n_drift: int
    level: float
    acceptance_split: dict[str, Any] | None = None  # DriftRun.split_json() of the run
    speed_split: dict[str, Any] | None = None  # DriftRun.speed_json()


@dataclass(frozen=True, slots=True)
class StoredResult:
    """A stored result with the run it belongs to."""

    run_id: str
    created_at: datetime
    result: DriftResult

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "created_at": self.created_at.isoformat(), **self.result.to_json()}


def latest_run(engine: Engine) -> StoredRun | None:
    """The newest stored run, None before the first."""
    r = DriftRunRow
    with engine.connect() as conn:
        row = conn.execute(
            select(
                r.run_id,
                r.started_at,
                r.finished_at,
                r.n_results,
                r.n_drift,
                r.level,
                r.acceptance_split,
                r.speed_split,
            )
            .order_by(r.started_at.desc(), r.id.desc())
            .limit(1)
        ).first()
    return StoredRun(*row) if row else None


def run_splits(engine: Engine, run_id: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The acceptance and decode-speed splits stored with run ``run_id``; None for an unknown run or one
    stored before they were kept."""
    r = DriftRunRow
    with engine.connect() as conn:
        row = conn.execute(select(r.acceptance_split, r.speed_split).where(r.run_id == run_id)).first()
    acceptance, speed = row if row is not None else (None, None)
    return (dict(acceptance) if acceptance is not None else None, dict(speed) if speed is not None else None)


def split_history(
    engine: Engine, start: datetime, end: datetime, limit: int = 500
) -> list[tuple[datetime, dict[str, Any]]]:
    """The acceptance splits of the runs started in ``[start, end)``, oldest first (at most the newest ``limit``)."""
    r = DriftRunRow
    with engine.connect() as conn:
        rows = conn.execute(
            select(r.started_at, r.acceptance_split)
            .where(r.started_at >= start, r.started_at < end, r.acceptance_split.is_not(None))
            .order_by(r.started_at.desc(), r.id.desc())
            .limit(limit)
        ).all()
    return [(started, dict(split)) for started, split in reversed(rows)]


def latest_results(
    engine: Engine,
    *,
    run_id: str | None = None,
    workload: str | None = None,
    test: str | None = None,
    metric: str | None = None,
    pair: str | None = None,
    decision: str | None = None,
) -> list[StoredResult]:
    """Results of the newest run (or of ``run_id``), filtered; ordered by workload, test, metric."""
    if run_id is None:
        newest = latest_run(engine)
        if newest is None:
            return []
        run_id = newest.run_id
    return results_history(
        engine, run_id=run_id, workload=workload, test=test, metric=metric, pair=pair, decision=decision, limit=None
    )


def results_history(
    engine: Engine,
    *,
    run_id: str | None = None,
    workload: str | None = None,
    test: str | None = None,
    metric: str | None = None,
    pair: str | None = None,
    decision: str | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    limit: int | None = 1000,
) -> list[StoredResult]:
    """Stored results across runs (newest first when ``run_id`` is None), with the same filters."""
    d = DriftResultRow
    query = select(d.__table__)
    for column, value in (
        (d.run_id, run_id),
        (d.workload, workload),
        (d.test, test),
        (d.metric, metric),
        (d.pair, pair),
        (d.decision, decision),
    ):
        if value is not None:
            query = query.where(column == value)
    if start is not None:
        query = query.where(d.created_at >= start)
    if end is not None:
        query = query.where(d.created_at < end)
    if run_id is not None:
        query = query.order_by(d.workload, d.pair, d.test, d.metric, d.id)
    else:
        query = query.order_by(d.created_at.desc(), d.id)
    if limit is not None:
        query = query.limit(limit)
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    return [
        StoredResult(
            row.run_id,
            row.created_at,
            DriftResult(
                test=row.test,
                metric=row.metric,
                n_ref=row.n_ref,
                n_cur=row.n_cur,
                statistic=row.statistic,
                p=row.p,
                effect=row.effect,
                ci=(row.ci_low, row.ci_high) if row.ci_low is not None and row.ci_high is not None else None,
                decision=row.decision,
                q=row.q,
                workload=row.workload,
                pair=row.pair,
                note=row.note,
                detail=row.detail or {},
                ref_start=row.ref_start,
                ref_end=row.ref_end,
                cur_start=row.cur_start,
                cur_end=row.cur_end,
            ),
        )
        for row in rows
    ]


def pin_baseline(
    engine: Engine, workload: str, *, at: datetime | None = None, length: timedelta = timedelta(days=1)
) -> tuple[datetime, datetime]:
    """Pin ``workload``'s reference window to ``[at - length, at)``; replaces an earlier pin."""
    end = at or datetime.now(UTC)
    end = end.replace(tzinfo=UTC) if end.tzinfo is None else end.astimezone(UTC)
    b = DriftBaselineRow
    with engine.begin() as conn:
        conn.execute(update(b).where(b.workload == workload, b.active.is_(True)).values(active=False))
        conn.execute(
            insert(b).values(
                workload=workload, ref_start=end - length, ref_end=end, created_at=datetime.now(UTC), active=True
            )
        )
    return end - length, end


def unpin_baseline(engine: Engine, workload: str) -> int:
    """Back to the rolling reference for ``workload``; returns how many pins were cleared."""
    b = DriftBaselineRow
    with engine.begin() as conn:
        return int(
            conn.execute(update(b).where(b.workload == workload, b.active.is_(True)).values(active=False)).rowcount
        )
