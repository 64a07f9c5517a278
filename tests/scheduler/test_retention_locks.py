"""Retention never queues writers behind its partition drops, and never runs beside the drift run (PostgreSQL).

Dropping a day's partition takes ACCESS EXCLUSIVE on ``requests``: while it waits for a long read of
the table, every INSERT queues behind it. A writer inserting batches through the store's writer path
times each one while a reader holds ``requests`` (a transaction that read it, then sleeps) and
retention drops an expired day: no batch may take over 0.2 s (with a 1 s lock timeout they took
about 1 s). The drift run is such a reader, so retention's ticks sit between drift ticks and the two
jobs never run at once; and the scheduler's own connections bound each statement of a job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.engine import Engine

from monitor.ingest.synthetic import synthetic_record
from monitor.scheduler.jobs import JOBS
from monitor.scheduler.models import JobRunRow
from monitor.scheduler.retention import apply_retention
from monitor.scheduler.service import SchedulerService
from monitor.scheduler.settings import RetentionSettings
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from monitor.store.partitions import PartitionLockError, ensure_all_partitions, list_partitions, partition_name
from monitor.store.writes.writer import write_batch
from tests.alerting import make_settings

DAY = datetime(2026, 11, 20, tzinfo=UTC)
NOW = DAY + timedelta(days=2, hours=12)  # one day kept: the partition of DAY has expired, DAY + 1 is the edge
STALL_S = 0.2  # the longest a writer's batch may take (the recorder flushes every 0.2 s by default)


@pytest.fixture
def pg(pg_url: str) -> Iterator[Engine]:
    """A migrated database with requests' days DAY to DAY + 3, and 24 requests on DAY (expired at NOW)."""
    engine = create_engine(pg_url)
    upgrade(engine)
    ensure_all_partitions(engine, DAY, 3)
    expired = [
        synthetic_record(i, start=DAY + timedelta(hours=i), spacing=timedelta(0), prefix="old") for i in range(24)
    ]
    with engine.begin() as conn:
        write_batch(conn, expired, "old", "sync")
    try:
        yield engine
    finally:
        engine.dispose()


def requests_only(wait_s: float) -> RetentionSettings:
    return RetentionSettings(requests_days=1, rollups_days=0, drift_days=0, alerts_days=0, jobs_days=0,
                             batches_days=0, partition_lock_wait_s=wait_s)  # fmt: skip


@dataclass
class Ingest:
    """Batches of 20 records written one after the other on DAY + 2 (a partition retention keeps), each timed."""

    engine: Engine
    seconds: list[float] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        batch = 0
        while not self.stop.is_set():
            records = [
                synthetic_record(
                    batch * 20 + i, start=DAY + timedelta(days=2), spacing=timedelta(seconds=1), prefix="w"
                )
                for i in range(20)
            ]
            t0 = time.perf_counter()
            with self.engine.begin() as conn:
                write_batch(conn, records, f"w{batch}", "live")
            self.seconds.append(time.perf_counter() - t0)
            batch += 1
            time.sleep(0.01)


def under_ingest_and_a_read(engine: Engine, read_s: float, work: Callable[[], Any]) -> tuple[Ingest, float]:
    """Run ``work`` while ingest goes on and a transaction holds its read of requests for ``read_s``.

    Returns the ingest and when the read ended, seconds after ``work`` began.
    """
    ingest = Ingest(engine)
    writer = threading.Thread(target=ingest.run)
    has_read, ended = threading.Event(), [0.0]

    def read() -> None:
        with engine.connect() as conn:
            conn.execute(text("SELECT count(*) FROM requests"))  # ACCESS SHARE on requests, held to the rollback
            has_read.set()
            conn.execute(text("SELECT pg_sleep(:s)"), {"s": read_s})
            conn.rollback()
        ended[0] = time.perf_counter()

    reader = threading.Thread(target=read)
    writer.start()
    try:
        time.sleep(0.2)  # ingest under way before the read
        reader.start()
        assert has_read.wait(5)
        t0 = time.perf_counter()
        try:
            work()
        finally:
            reader.join()
    finally:
        ingest.stop.set()
        writer.join()
    return ingest, ended[0] - t0


def partition_exists(engine: Engine, start: datetime) -> bool:
    with engine.connect() as conn:
        return partition_name(start) in {p.name for p in list_partitions(conn)}


def test_retention_drops_a_day_under_ingest_while_a_long_read_holds_requests_and_no_writer_waits(pg: Engine) -> None:
    deleted: dict[str, int] = {}
    ingest, read_ended = under_ingest_and_a_read(
        pg, 1.5, lambda: deleted.update(apply_retention(pg, requests_only(wait_s=10), NOW))
    )
    assert max(ingest.seconds) < STALL_S, f"a writer's batch waited {max(ingest.seconds):.3f} s"
    assert len(ingest.seconds) > 10  # ingest went on all along
    assert deleted["requests_partitions_dropped"] == 1 and not partition_exists(pg, DAY)  # once the read ended
    assert read_ended > 1.0  # retention did wait for the read


def test_a_read_longer_than_retentions_wait_fails_the_drop_for_now_and_still_no_writer_waits(pg: Engine) -> None:
    failed: list[PartitionLockError] = []

    def drop() -> None:
        try:
            apply_retention(pg, requests_only(wait_s=1.0), NOW)
        except PartitionLockError as error:  # the job fails, to drop the day on its next run
            failed.append(error)

    ingest, _ = under_ingest_and_a_read(pg, 2.0, drop)
    assert max(ingest.seconds) < STALL_S, f"a writer's batch waited {max(ingest.seconds):.3f} s"
    assert failed and partition_exists(pg, DAY)
    assert apply_retention(pg, requests_only(wait_s=1.0), NOW)["requests_partitions_dropped"] == 1  # the next run


def test_retention_ticks_fall_between_drift_ticks_and_the_two_jobs_never_run_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    engine = create_engine(url)
    upgrade(engine)

    def slow(engine: Engine, settings: Any, tick: datetime, fence: Any) -> dict[str, Any]:
        time.sleep(0.7)  # a drift run's read of requests, a retention run's drops
        return {}

    monkeypatch.setitem(JOBS, "drift", slow)
    monkeypatch.setitem(JOBS, "retention", slow)
    settings = make_settings(tmp_path, url, DRAFTWATCH_SCHEDULER_DRIFT_INTERVAL="1s",
                             DRAFTWATCH_SCHEDULER_RETENTION_INTERVAL="1s")  # fmt: skip
    service = SchedulerService(settings, engine, jobs=["drift", "retention"]).start()
    try:
        time.sleep(4)
    finally:
        service.stop()
    with engine.connect() as conn:
        runs = conn.execute(select(JobRunRow.job, JobRunRow.tick, JobRunRow.started_at, JobRunRow.finished_at)).all()
    engine.dispose()
    drift = [r for r in runs if r.job == "drift"]
    retention = [r for r in runs if r.job == "retention"]
    assert drift and retention
    # Each retention tick half a drift interval past a drift tick, never on one.
    assert {r.tick.replace(tzinfo=UTC).microsecond for r in retention} == {500_000}
    assert {r.tick.replace(tzinfo=UTC).microsecond for r in drift} == {0}
    for d in drift:
        for r in retention:
            assert d.finished_at <= r.started_at or r.finished_at <= d.started_at, "drift and retention overlapped"


def test_the_schedulers_own_connections_bound_each_statement(pg_url: str, tmp_path: Path) -> None:
    service = SchedulerService(make_settings(tmp_path, pg_url, DRAFTWATCH_SCHEDULER_STATEMENT_TIMEOUT_S="2.5"))
    try:
        with service.engine.connect() as conn:  # what every job's statements run under
            assert conn.execute(text("SHOW statement_timeout")).scalar_one() == "2500ms"
    finally:
        service.engine.dispose()
