"""The retention job: delete rows older than ``retention.*_days`` per table (0 keeps everything).

Requests go by ``ts_start``; rollups by bucket (they are additive history, so deleting requests
does not change them); drift runs and results by start; finished notifications (delivered or
dead), resolved or inactive alerts and ended silences by age; job history by start; the
recorder's committed batch ids by commit time (replay stays exactly-once without them: a record's
``request_id`` is unique). Model versions
and deployment events are kept: they are small and annotate every chart.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete
from sqlalchemy.engine import Connection, Engine

from monitor.alerts.models import AlertRow, SilenceRow
from monitor.drift.models import DriftResultRow, DriftRunRow
from monitor.notify.models import NotificationRow
from monitor.scheduler.models import JobRunRow
from monitor.scheduler.settings import RetentionSettings
from monitor.store.models import RecorderBatchRow, RequestRow, RollupBinRow, RollupMinuteRow
from monitor.store.types import Fence

log = logging.getLogger(__name__)


def apply_retention(
    engine: Engine, retention: RetentionSettings, now: datetime, fence: Fence | None = None
) -> dict[str, int]:
    """Delete what is past retention in one transaction; returns rows deleted per table."""
    plan: list[tuple[str, int, Any]] = [
        ("requests", retention.requests_days, lambda c: delete(RequestRow).where(RequestRow.ts_start < c)),
        ("rollup_minute", retention.rollups_days, lambda c: delete(RollupMinuteRow).where(
            RollupMinuteRow.bucket < c)),
        ("rollup_bins", retention.rollups_days, lambda c: delete(RollupBinRow).where(RollupBinRow.bucket < c)),
        ("drift_results", retention.drift_days, lambda c: delete(DriftResultRow).where(
            DriftResultRow.created_at < c)),
        ("drift_runs", retention.drift_days, lambda c: delete(DriftRunRow).where(DriftRunRow.started_at < c)),
        ("notifications", retention.alerts_days, lambda c: delete(NotificationRow).where(
            NotificationRow.status.in_(("delivered", "dead")), NotificationRow.created_at < c)),
        ("alerts", retention.alerts_days, lambda c: delete(AlertRow).where(
            AlertRow.state.in_(("resolved", "inactive")), AlertRow.updated_at < c)),
        ("silences", retention.alerts_days, lambda c: delete(SilenceRow).where(SilenceRow.ends_at < c)),
        ("job_runs", retention.jobs_days, lambda c: delete(JobRunRow).where(JobRunRow.started_at < c)),
        ("recorder_batches", retention.batches_days, lambda c: delete(RecorderBatchRow).where(
            RecorderBatchRow.committed_at < c)),
    ]  # fmt: skip
    deleted: dict[str, int] = {}
    with engine.begin() as conn:
        for table, days, statement in plan:
            if days > 0:
                deleted[table] = _run(conn, statement(now - timedelta(days=days)))
        if fence is not None:
            fence(conn)
    if any(deleted.values()):
        log.info("retention deleted %s", {k: v for k, v in deleted.items() if v})
    return deleted


def _run(conn: Connection, statement: Any) -> int:
    return int(conn.execute(statement).rowcount or 0)
