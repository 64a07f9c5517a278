"""The retention job on a real store: what is past retention goes, what is not stays (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, insert, select, text
from sqlalchemy.engine import Connection, Engine

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


def only_batch_ids(**settings: Any) -> RetentionSettings:
    """Retention of the recorder's batch ids alone (7 days), every other table kept."""
    kept = dict.fromkeys(("requests_days", "rollups_days", "drift_days", "alerts_days", "jobs_days"), 0)
    return RetentionSettings(**kept, batches_days=7, **settings)


def _batch_ids(engine: Engine, ages: dict[str, int]) -> None:
    rows = [
        {"batch_id": name, "origin": "live", "n_records": 1, "committed_at": NOW - timedelta(days=days), "host": "h",
         "pid": 1}
        for name, days in ages.items()
    ]  # fmt: skip
    with engine.begin() as conn:
        conn.execute(insert(RecorderBatchRow), rows)


def test_expired_rows_go_in_transactions_of_at_most_batch_size_rows_each_fenced(engine: Engine) -> None:
    _batch_ids(engine, {f"old-{i}": 10 for i in range(10)} | {"recent": 1, "today": 0})
    timeouts: list[str] = []

    def fence(conn: Connection) -> None:  # the leader's check, once per transaction
        if conn.dialect.name == "postgresql":
            timeouts.append(conn.execute(text("SHOW statement_timeout")).scalar_one())
        else:
            timeouts.append("")

    deleted = apply_retention(engine, only_batch_ids(batch_size=3, batch_timeout_s=2.5), NOW, fence)
    assert deleted["recorder_batches"] == 10
    # Ten expired rows in batches of three: 3, 3, 3 and the last 1, four transactions, four fence checks.
    assert len(timeouts) == 4
    if engine.dialect.name == "postgresql":
        assert set(timeouts) == {"2500ms"}  # each transaction bounded in time, too
    with engine.connect() as conn:
        assert set(conn.execute(select(RecorderBatchRow.batch_id)).scalars()) == {"recent", "today"}


def test_a_fence_that_fails_stops_retention_and_keeps_what_was_committed(engine: Engine) -> None:
    _batch_ids(engine, {f"old-{i}": 10 for i in range(7)})
    calls = 0

    def fence(conn: Connection) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("the lease was taken over")

    with pytest.raises(RuntimeError, match="taken over"):
        apply_retention(engine, only_batch_ids(batch_size=3), NOW, fence)
    with engine.connect() as conn:
        # The first batch committed; the second was rolled back with its failed fence; the third never ran.
        assert conn.execute(select(func.count()).select_from(RecorderBatchRow)).scalar_one() == 4
