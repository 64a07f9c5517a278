"""The retention job on a real store: what is past retention goes, what is not stays (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import func, insert, select
from sqlalchemy.engine import Engine

from monitor.scheduler.retention import apply_retention
from monitor.scheduler.settings import RetentionSettings
from monitor.store.models import RecorderBatchRow

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def test_recorder_batch_ids_past_retention_are_pruned_and_recent_ones_kept(engine: Engine) -> None:
    ages = {"old-1": 30, "old-2": 8, "recent": 6, "today": 0}
    with engine.begin() as conn:
        conn.execute(
            insert(RecorderBatchRow),
            [
                {
                    "batch_id": name,
                    "origin": "live",
                    "n_records": 1000,
                    "committed_at": NOW - timedelta(days=days),
                    "host": "h",
                    "pid": 1,
                }
                for name, days in ages.items()
            ],
        )
    deleted = apply_retention(engine, RetentionSettings(batches_days=7), NOW)
    assert deleted["recorder_batches"] == 2
    with engine.connect() as conn:
        left = set(conn.execute(select(RecorderBatchRow.batch_id)).scalars())
    assert left == {"recent", "today"}


def test_zero_days_keeps_every_batch_id(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            insert(RecorderBatchRow).values(
                batch_id="ancient", origin="spool", n_records=1, committed_at=NOW - timedelta(days=900)
            )
        )
    deleted = apply_retention(engine, RetentionSettings(batches_days=0), NOW)
    assert "recorder_batches" not in deleted
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(RecorderBatchRow)).scalar_one() == 1
