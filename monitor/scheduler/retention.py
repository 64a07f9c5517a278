"""The retention job: delete rows older than ``retention.*_days`` per table (0 keeps everything).

Requests go by ``ts_start``; rollups by bucket (they are additive history, so deleting requests
does not change them); drift runs and results by start; finished notifications (delivered or
dead), resolved or inactive alerts and ended silences by age; job history by start; the
recorder's committed batch ids by commit time (replay stays exactly-once without them: a record's
``request_id`` is unique). Model versions
and deployment events are kept: they are small and annotate every chart.

A table's expired rows go in transactions of at most ``retention.batch_size`` rows, each committed
before the next (and each bounded in time on PostgreSQL by ``retention.batch_timeout_s``): one
transaction over a month of a busy fleet's requests would hold its locks and its WAL for hours. The
leader's fence is checked in every one of them, so a replica that lost the lease stops after at most
one more batch, and what was committed stays deleted.

On PostgreSQL, where ``requests`` is partitioned by day and the rollups by week (docs/postgresql.md),
their expired partitions are not deleted row by row: each partition that ends before the cutoff is
detached and dropped in a transaction of its own, fenced
(:func:`monitor.store.partitions.drop_expired_partitions`). The partition holding the cutoff is kept
whole until it has expired too (for requests ``retention.requests_edge`` keep; always for the
rollups): deleting its expired rows at each run would, over its days, delete nearly all of them row
by row, the WAL and bloat partitioning is there to avoid. With ``requests_edge`` delete requests'
go by the batched delete, for retention exact to the minute; rollups, additive counts kept 400 days
by default, live up to a week past theirs instead. The default partitions' expired rows always go by
the batched delete (no partition drop ever takes them). A drop waits for its lock at most 50 ms at
a time, so that writers never queue behind it for longer, and tries again after a jittered pause
for up to ``retention.partition_lock_wait_s`` (:func:`monitor.store.partitions.with_ddl_retries`).
Should a partition stay locked all that time, the batched delete of its table is skipped this time
(it would delete that whole partition row by row) and the job fails, to run again on its next tick.
While ``draftwatch db partition`` converts a table, that table is left alone.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, delete, select, text
from sqlalchemy.engine import Engine

from monitor.alerts.models import AlertRow, SilenceRow
from monitor.drift.models import DriftResultRow, DriftRunRow
from monitor.notify.models import NotificationRow
from monitor.scheduler.models import JobRunRow
from monitor.scheduler.settings import RetentionSettings
from monitor.store.models import RecorderBatchRow, RequestRow, RollupBinRow, RollupMinuteRow
from monitor.store.partitions import (
    TABLES,
    PartitionLockError,
    drop_expired_partitions,
    is_partitioned,
    partition_start,
)
from monitor.store.repartition import conversion_in_progress
from monitor.store.types import Fence

log = logging.getLogger(__name__)

PARTITIONED = frozenset(t.name for t in TABLES)


def apply_retention(
    engine: Engine,
    retention: RetentionSettings,
    now: datetime,
    fence: Fence | None = None,
    *,
    by_partition: bool = True,
) -> dict[str, int]:
    """Delete what is past retention, in bounded transactions (see the module docstring); rows deleted per table.

    ``by_partition`` False deletes expired rows row by row even from a partitioned table (what
    benchmarks/store_scale.py compares dropping partitions with).
    """
    plan: list[tuple[str, int, Any, Any]] = [
        ("requests", retention.requests_days, RequestRow, lambda c: RequestRow.ts_start < c),
        ("rollup_minute", retention.rollups_days, RollupMinuteRow, lambda c: RollupMinuteRow.bucket < c),
        ("rollup_bins", retention.rollups_days, RollupBinRow, lambda c: RollupBinRow.bucket < c),
        ("drift_results", retention.drift_days, DriftResultRow, lambda c: DriftResultRow.created_at < c),
        ("drift_runs", retention.drift_days, DriftRunRow, lambda c: DriftRunRow.started_at < c),
        ("notifications", retention.alerts_days, NotificationRow, lambda c: and_(
            NotificationRow.status.in_(("delivered", "dead")), NotificationRow.created_at < c)),
        ("alerts", retention.alerts_days, AlertRow, lambda c: and_(
            AlertRow.state.in_(("resolved", "inactive")), AlertRow.updated_at < c)),
        ("silences", retention.alerts_days, SilenceRow, lambda c: SilenceRow.ends_at < c),
        ("job_runs", retention.jobs_days, JobRunRow, lambda c: JobRunRow.started_at < c),
        ("recorder_batches", retention.batches_days, RecorderBatchRow, lambda c: RecorderBatchRow.committed_at < c),
    ]  # fmt: skip
    deleted: dict[str, int] = {}
    failed: PartitionLockError | None = None
    for table, days, model, expired in plan:
        if days <= 0:
            continue
        cutoff: datetime | None = now - timedelta(days=days)
        if table in PARTITIONED:
            edge = retention.requests_edge if table == "requests" else "keep"
            try:
                cutoff = _drop_partitions(engine, table, now - timedelta(days=days), fence, deleted,
                                          drop=by_partition, edge=edge,
                                          wait_s=retention.partition_lock_wait_s)  # fmt: skip
            except PartitionLockError as error:
                log.warning("retention: %s; %s is deleted on the next run", error, table)
                failed = failed or error
                continue
            if cutoff is None:
                continue
        deleted[table] = _delete_in_batches(engine, model, expired(cutoff), retention, fence)
    if any(deleted.values()):
        log.info("retention deleted %s", {k: v for k, v in deleted.items() if v})
    if failed is not None:
        raise failed
    return deleted


def _drop_partitions(
    engine: Engine,
    table: str,
    cutoff: datetime,
    fence: Fence | None,
    deleted: dict[str, int],
    *,
    drop: bool,
    edge: str,
    wait_s: float,
) -> datetime | None:
    """Drop ``table``'s whole expired partitions (PostgreSQL, ``drop``); the cutoff left for the batched delete.

    None: the table must not be deleted from now. With ``edge`` keep, the cutoff moves back to the
    start of the partition holding it, so that only the default partition's expired rows are deleted.
    """
    if engine.dialect.name != "postgresql":
        return cutoff
    with engine.connect() as conn:
        converting, partitioned = conversion_in_progress(conn, table), is_partitioned(conn, table)
        edge_start = partition_start(conn, cutoff, table) if partitioned and drop and edge == "keep" else None
    if converting:
        log.info("retention leaves %s alone while `draftwatch db partition` converts the table", table)
        return None
    if partitioned and drop:
        dropped = drop_expired_partitions(engine, cutoff, fence, parent=table, wait_s=wait_s)
        deleted[f"{table}_partitions_dropped"] = len(dropped)
        deleted[f"{table}_rows_dropped_estimate"] = sum(d.rows_estimate for d in dropped)
    return cutoff if edge_start is None else min(cutoff, edge_start)


def _delete_in_batches(
    engine: Engine, model: Any, expired: Any, retention: RetentionSettings, fence: Fence | None
) -> int:
    """Delete ``model``'s rows matching ``expired``, ``retention.batch_size`` of them per transaction."""
    batch = select(model.id).where(expired).limit(retention.batch_size).scalar_subquery()
    total = 0
    while True:
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                # SET LOCAL takes no bind parameter; the value is a parsed float, in milliseconds.
                conn.execute(text(f"SET LOCAL statement_timeout = {max(1, int(retention.batch_timeout_s * 1000))}"))
            # The condition again outside the batch's ids: on a partitioned table it confines the delete to
            # the partitions before the cutoff, where ids alone would be looked up in every one.
            count = int(conn.execute(delete(model).where(expired, model.id.in_(batch))).rowcount or 0)
            if fence is not None:
                fence(conn)
        total += count
        if count < retention.batch_size:
            return total
