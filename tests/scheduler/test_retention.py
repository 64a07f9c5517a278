"""The retention job on a real store: what is past retention goes, what is not stays (SQLite and PostgreSQL).

On PostgreSQL requests' expired days and the rollups' expired weeks go as whole partitions; the partition at
the cutoff is kept whole until it expires (requests' by the batched delete with requests_edge delete).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, insert, select, text
from sqlalchemy.engine import Connection, Engine

from monitor.config import Settings
from monitor.ingest.synthetic import synthetic_record
from monitor.scheduler.jobs import retention_job
from monitor.scheduler.retention import apply_retention
from monitor.scheduler.settings import RetentionSettings
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from monitor.store.models import RecorderBatchRow, RequestRow, RollupBinRow, RollupMinuteRow
from monitor.store.partitions import (
    PartitionLockError,
    ensure_all_partitions,
    ensure_partitions,
    grid_start,
    list_partitions,
    partition_name,
)
from monitor.store.writes.writer import write_batch

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


DAY = datetime(2026, 11, 20, tzinfo=UTC)


def only_requests(**settings: Any) -> RetentionSettings:
    """Retention of requests alone, every other table kept."""
    kept = dict.fromkeys(("rollups_days", "drift_days", "alerts_days", "jobs_days", "batches_days"), 0)
    return RetentionSettings(**kept, **settings)


def _requests_over(engine: Engine, days: int, per_day: int) -> None:
    records = [
        synthetic_record(d * per_day + i, start=DAY + timedelta(days=d, hours=24 * i / per_day), spacing=timedelta(0))
        for d in range(days)
        for i in range(per_day)
    ]
    with engine.begin() as conn:
        write_batch(conn, records, "days", "sync")


def _request_starts(engine: Engine) -> list[datetime]:
    with engine.connect() as conn:
        return sorted(conn.execute(select(RequestRow.ts_start)).scalars())


def test_expired_days_of_requests_are_dropped_whole_and_the_edge_deleted_in_batches(engine: Engine) -> None:
    # Five days of 12 requests (one every two hours) from DAY; on PostgreSQL each day in its own partition.
    ensure_partitions(engine, DAY, 4)
    _requests_over(engine, 5, 12)
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.execute(text("ANALYZE requests"))  # the dropped rows are counted by the statistics
    now = DAY + timedelta(days=5, hours=7)  # 2 days kept: the cutoff is day 3, 07:00
    fenced: list[str] = []
    settings = only_requests(requests_days=2, batch_size=2, requests_edge="delete")
    deleted = apply_retention(engine, settings, now, lambda c: fenced.append(""))
    cutoff = now - timedelta(days=2)
    assert _request_starts(engine)[0] >= cutoff and len(_request_starts(engine)) == 60 - 36 - 4
    if engine.dialect.name == "postgresql":
        # Days 0-2 (36 requests) dropped as three partitions, day 3's 00:00-06:00 (4 requests) deleted in 2 batches.
        assert deleted == {"requests_partitions_dropped": 3, "requests_rows_dropped_estimate": 36, "requests": 4}
        assert len(fenced) == 3 + 3  # a transaction per partition; batches of 2, 2 and the last, empty one
        with engine.connect() as conn:
            assert [
                p.name for p in list_partitions(conn) if p.start is not None and p.start < now - timedelta(days=2)
            ] == ["requests_p20261123"]
    else:
        assert deleted == {"requests": 40}  # one table: every expired row by the batched delete
        assert len(fenced) == 21


def test_by_default_the_partition_at_the_cutoff_is_kept_whole_until_it_can_be_dropped(engine: Engine) -> None:
    # As above, plus one request ten days before DAY: no partition covers it, so it sits in the default one.
    ensure_partitions(engine, DAY, 4)
    _requests_over(engine, 5, 12)
    stray = synthetic_record(999, start=DAY - timedelta(days=10), spacing=timedelta(0), prefix="stray")
    with engine.begin() as conn:
        write_batch(conn, [stray], "stray", "sync")
        if engine.dialect.name == "postgresql":
            conn.execute(text("ANALYZE requests"))
    now = DAY + timedelta(days=5, hours=7)  # the cutoff is day 3, 07:00
    deleted = apply_retention(engine, only_requests(requests_days=2, batch_size=2), now)
    starts = _request_starts(engine)
    if engine.dialect.name == "postgresql":
        # Days 0-2 dropped whole; day 3 kept whole (its 00:00-06:00 too) until the run after it ends; the
        # stray request deleted from the default partition, which no drop would ever take.
        assert deleted == {"requests_partitions_dropped": 3, "requests_rows_dropped_estimate": 36, "requests": 1}
        assert starts[0] == DAY + timedelta(days=3) and len(starts) == 60 - 36
        later = apply_retention(engine, only_requests(requests_days=2), now + timedelta(days=1))
        assert later["requests_partitions_dropped"] == 1 and later["requests"] == 0
        assert _request_starts(engine)[0] == DAY + timedelta(days=4)
    else:  # no partitions: retention stays exact
        assert deleted == {"requests": 41} and starts[0] >= now - timedelta(days=2)


def only_rollups(**settings: Any) -> RetentionSettings:
    """Retention of the rollups alone, every other table kept."""
    return RetentionSettings(requests_days=0, drift_days=0, alerts_days=0, jobs_days=0, batches_days=0, **settings)


def _rollup_buckets(engine: Engine, model: Any) -> list[datetime]:
    with engine.connect() as conn:
        return sorted(conn.execute(select(model.bucket)).scalars())


def _bins_between(engine: Engine, start: datetime, end: datetime) -> int:
    with engine.connect() as conn:
        query = select(func.count()).where(RollupBinRow.bucket >= start, RollupBinRow.bucket < end)
        return int(conn.execute(query).scalar_one())


def test_expired_weeks_of_rollups_are_dropped_whole_and_the_week_at_the_cutoff_kept(engine: Engine) -> None:
    # A request at noon each day for five weeks (on PostgreSQL a partition of rollups a week), and a stray one
    # ten weeks before them, in the default partitions: no partition of its week exists.
    week0 = grid_start(DAY, 7)
    ensure_all_partitions(engine, week0, 28)
    records = [synthetic_record(d, start=week0 + timedelta(days=d, hours=12), spacing=timedelta(0)) for d in range(35)]
    records.append(synthetic_record(99, start=week0 - timedelta(weeks=10), spacing=timedelta(0), prefix="stray"))
    with engine.begin() as conn:
        write_batch(conn, records, "weeks", "sync")
        if engine.dialect.name == "postgresql":
            conn.execute(text("ANALYZE rollup_minute, rollup_bins"))
    now = week0 + timedelta(days=37)  # 20 days kept: the cutoff is day 17, in the third week
    long_ago, cutoff = week0 - timedelta(weeks=20), now - timedelta(days=20)
    stray_bins, expired_bins = _bins_between(engine, long_ago, week0), _bins_between(engine, long_ago, cutoff)
    two_weeks_of_bins = _bins_between(engine, week0, week0 + timedelta(days=14))
    deleted = apply_retention(engine, only_rollups(rollups_days=20, batch_size=5), now)
    minutes, bin_buckets = _rollup_buckets(engine, RollupMinuteRow), _rollup_buckets(engine, RollupBinRow)
    if engine.dialect.name == "postgresql":
        # Weeks 0 and 1 dropped whole, week 2 kept whole (its days before the cutoff too), the stray deleted.
        assert {k: v for k, v in deleted.items() if k.startswith("rollup_minute")} == {
            "rollup_minute_partitions_dropped": 2, "rollup_minute_rows_dropped_estimate": 14,
            "rollup_minute": 1}  # fmt: skip
        assert {k: v for k, v in deleted.items() if k.startswith("rollup_bins")} == {
            "rollup_bins_partitions_dropped": 2, "rollup_bins_rows_dropped_estimate": two_weeks_of_bins,
            "rollup_bins": stray_bins}  # fmt: skip
        assert minutes[0] == week0 + timedelta(days=14, hours=12) and len(minutes) == 21
        assert bin_buckets[0] == minutes[0]
        later = apply_retention(engine, only_rollups(rollups_days=20), now + timedelta(days=7))
        assert later["rollup_minute_partitions_dropped"] == 1 and later["rollup_minute"] == 0
        assert _rollup_buckets(engine, RollupMinuteRow)[0] == week0 + timedelta(days=21, hours=12)
        with engine.connect() as conn:
            weeks = [p.start for p in list_partitions(conn, "rollup_bins") if p.start is not None]
        assert weeks[0] == week0 + timedelta(days=21)
    else:  # one table each: retention exact, every expired row by the batched delete
        assert deleted == {"rollup_minute": 18, "rollup_bins": expired_bins}
        assert minutes[0] == week0 + timedelta(days=17, hours=12) and bin_buckets[0] == minutes[0]


def test_a_partition_held_by_a_long_read_is_neither_dropped_nor_deleted_row_by_row(pg_url: str) -> None:
    engine = create_engine(pg_url)
    upgrade(engine)
    ensure_partitions(engine, DAY, 2)
    _requests_over(engine, 3, 4)
    now = DAY + timedelta(days=2, hours=12)
    with engine.begin() as conn:
        conn.execute(
            insert(RecorderBatchRow).values(
                batch_id="old", origin="live", n_records=1, committed_at=DAY - timedelta(days=10)
            )
        )
    settings = RetentionSettings(requests_days=1, batches_days=7, rollups_days=0, drift_days=0, alerts_days=0,
                                 jobs_days=0, partition_lock_wait_s=0.3)  # fmt: skip
    with engine.connect() as reader:
        reader.execute(text("SELECT count(*) FROM requests"))  # an open read holds its lock on requests
        with pytest.raises(PartitionLockError):
            apply_retention(engine, settings, now)
        reader.rollback()
    assert len(_request_starts(engine)) == 12  # left whole for the next run, not deleted row by row meanwhile
    with engine.connect() as conn:  # the other tables' retention ran
        assert set(conn.execute(select(RecorderBatchRow.batch_id)).scalars()) == {"days"}
    engine.dispose()


def test_the_retention_job_makes_the_partitions_ahead_past_its_next_run(pg_url: str, tmp_path: Path) -> None:
    engine = create_engine(pg_url)
    upgrade(engine)
    environ = {
        "HOME": str(tmp_path),
        "DRAFTWATCH_DATABASE_URL": pg_url,
        "DRAFTWATCH_DATABASE_PARTITIONS_AHEAD_DAYS": "2",
        "DRAFTWATCH_SCHEDULER_RETENTION_INTERVAL": "5d",
    }
    detail = retention_job(engine, Settings.from_env(environ, None), datetime.now(UTC), lambda conn: None)
    with engine.connect() as conn:
        starts = [p.start for p in list_partitions(conn) if p.start is not None]
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    # The upgrade made today to 7 days ahead; the job, whose next run is 5 days away, keeps 6 ahead: none missing.
    assert detail["partitions_created"] == 0 and starts[-1] == today + timedelta(days=7)
    with engine.begin() as conn:
        conn.execute(text(f"DROP TABLE {partition_name(today + timedelta(days=6))}"))
        conn.execute(text(f"DROP TABLE {partition_name(today + timedelta(days=7))}"))
    detail = retention_job(engine, Settings.from_env(environ, None), datetime.now(UTC), lambda conn: None)
    assert detail["partitions_created"] == 1  # day 6 again, not day 7: max(2, 5 + 1) days ahead
    engine.dispose()
