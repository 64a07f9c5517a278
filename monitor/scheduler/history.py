"""What the scheduler did: job runs, newest first, and who holds the lease (``GET /v1/jobs``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Engine

from monitor.scheduler.models import JobRunRow, LeaseRow
from monitor.store.types import iso


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
            "acquired_at": iso(lease.acquired_at), "renewed_at": iso(lease.renewed_at),
            "expires_at": iso(lease.expires_at),
        },
        "runs": [
            {"id": r.id, "job": r.job, "tick": iso(r.tick), "holder": r.holder, "epoch": r.epoch,
             "status": r.status, "started_at": iso(r.started_at), "finished_at": iso(r.finished_at),
             "duration_s": r.duration_s, "error": r.error, "detail": r.detail}
            for r in runs
        ],
    }  # fmt: skip
