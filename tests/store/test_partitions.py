"""The partitioned requests table on PostgreSQL (migration 0014, monitor/store/partitions.py); SQLite unchanged.

Partitions are made ahead and by range, replicas making them at once make each once, a record far
off lands in the default partition and moves out when its partition is made, a replayed batch is
stored once, expired partitions are detached and dropped whole (fenced, bounded in lock time), and
a windowed read's plan touches only the partitions of its window.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, func, select, text
from sqlalchemy.engine import Connection, Engine

from decoder.record import RequestRecord
from monitor.drift.sampling import sample_requests
from monitor.ingest.synthetic import synthetic_record
from monitor.store import partitions
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from monitor.store.models import RequestRow
from monitor.store.partitions import (
    PartitionLockError,
    drop_expired_partitions,
    ensure_partitions,
    grid_start,
    is_partitioned,
    list_partitions,
)
from monitor.store.reads import dashboard as dashboard_queries
from monitor.store.reads import queries
from monitor.store.reads.results import Pair
from monitor.store.writes.writer import write_batch

DAY0 = datetime(2027, 1, 10, tzinfo=UTC)
PAIR = Pair("qwen-coder-1.5b", "model", "qwen-coder-0.5b")
INDEXES = {
    "pk_requests",
    "uq_requests_request_id_ts_start",
    "ix_requests_workload_ts",
    "ix_requests_pair_ts",
    "ix_requests_ts",
    "ix_requests_baseline_workload_ts",
    "ix_requests_baseline_target_ts",
}


@pytest.fixture
def pg(pg_url: str) -> Iterator[Engine]:
    """A migrated PostgreSQL database whose requests has only its default partition (the tests make the days)."""
    engine = create_engine(pg_url)
    upgrade(engine)
    with engine.begin() as conn:
        for partition in list_partitions(conn):
            if not partition.is_default:  # today's and the days ahead that the upgrade made
                conn.execute(text(f"DROP TABLE {partition.name}"))
    try:
        yield engine
    finally:
        engine.dispose()


def day(n: int, hours: float = 0) -> datetime:
    return DAY0 + timedelta(days=n, hours=hours)


def records_over(days: int, per_day: int, *, prefix: str = "r", first: int = 0) -> list[RequestRecord]:
    """``per_day`` records on each of ``days`` days from DAY0 + ``first``, spread over the day, three workloads."""
    spacing = timedelta(days=1) / per_day
    return [
        synthetic_record(
            d * per_day + i,
            workload=("chat", "code", "extract")[i % 3],
            start=day(first + d) + i * spacing,
            spacing=timedelta(0),
            prefix=prefix,
            mode="holdout" if i % 10 == 3 else "speculative",
        )
        for d in range(days)
        for i in range(per_day)
    ]


def write(engine: Engine, records: list[RequestRecord], batch_id: str) -> int:
    with engine.begin() as conn:
        return write_batch(conn, records, batch_id, "sync").stored


def where_rows_are(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT tableoid::regclass::text, count(*) FROM requests GROUP BY 1"))
        return {name: int(n) for name, n in rows}


def count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(RequestRow)).scalar_one())


def test_sqlite_keeps_its_one_table_and_the_partition_functions_do_nothing(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'dw.db'}")
    upgrade(engine)
    with engine.connect() as conn:
        sql = conn.execute(text("SELECT sql FROM sqlite_master WHERE name = 'requests'")).scalar_one()
        assert not is_partitioned(conn)
    assert "CONSTRAINT uq_requests_request_id UNIQUE (request_id)" in sql and "PRIMARY KEY (id)" in sql
    assert ensure_partitions(engine, DAY0, 7) == [] and drop_expired_partitions(engine, day(30)) == []
    # Still one row per request id, even with another start.
    assert write(engine, records_over(1, 4), "a") == 4
    moved = [
        synthetic_record(i, workload=("chat", "code", "extract")[i % 3], start=day(5), prefix="r") for i in range(4)
    ]
    assert write(engine, moved, "b") == 0
    engine.dispose()


def test_a_fresh_install_is_partitioned_with_every_index_per_partition(pg_url: str) -> None:
    pg = create_engine(pg_url)
    upgrade(pg)
    with pg.connect() as conn:
        assert is_partitioned(conn)
        keys: dict[str, str] = dict(
            conn.execute(
                text(
                    "SELECT conname, array_to_string(array(SELECT attname FROM pg_attribute a, unnest(c.conkey) k "
                    "WHERE a.attrelid = c.conrelid AND a.attnum = k), ',') FROM pg_constraint c "
                    "WHERE conrelid = 'requests'::regclass AND contype IN ('p', 'u')"
                )
            ).all()
        )
        parent_indexes = set(
            conn.execute(text("SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = 'requests'::regclass"))
            .scalars()
            .all()
        )
        found = list_partitions(conn)
        today = grid_start(datetime.now(UTC), 1)
        per_partition = {
            p.name: set(
                conn.execute(
                    text("SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = to_regclass(:p)"),
                    {"p": p.name},
                ).scalars()
            )
            for p in found
        }
    assert keys == {"pk_requests": "id,ts_start", "uq_requests_request_id_ts_start": "request_id,ts_start"}
    assert parent_indexes == INDEXES
    # Today's partition and the next seven days' (database.partitions_ahead_days), and the default partition.
    assert [p.start for p in found if not p.is_default] == [today + timedelta(days=n) for n in range(8)]
    assert [p.name for p in found if p.is_default] == ["requests_default"]
    for name, indexes in per_partition.items():
        assert indexes == {f"{index}_{name.removeprefix('requests_')}" for index in INDEXES}, name
    pg.dispose()


def test_partitions_are_made_ahead_on_the_grid_once(pg: Engine) -> None:
    created = ensure_partitions(pg, day(0, 13.5), 3)
    assert created == [f"requests_p202701{d}" for d in (10, 11, 12, 13)]
    assert ensure_partitions(pg, day(0, 20), 3) == []  # idempotent
    with pg.connect() as conn:
        conn.execute(text("SET TimeZone = 'UTC'"))
        bounds = {p.name: (p.start, p.end) for p in list_partitions(conn)}
    assert bounds["requests_p20270111"] == (day(1), day(2))
    # Weekly partitions after daily ones: only the days no partition holds yet are made (the grid is the epoch's).
    weekly = ensure_partitions(pg, day(0), 14, partition_days=7)
    week = grid_start(day(14), 7)
    with pg.connect() as conn:
        conn.execute(text("SET TimeZone = 'UTC'"))
        made = {p.name: (p.start, p.end) for p in list_partitions(conn) if p.name in weekly and p.start and p.end}
    assert (week, week + timedelta(days=7)) in made.values()
    assert all(end <= day(0) or start >= day(4) for start, end in made.values())  # none overlaps the daily ones
    ranges = sorted([*made.values(), (day(0), day(4))])
    assert ranges[0][0] == grid_start(day(0), 7) and ranges[-1][1] == week + timedelta(days=7)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))  # the weeks covered without a hole


def test_replicas_making_the_partitions_at_once_make_each_once(pg: Engine) -> None:
    made: list[list[str]] = []
    errors: list[BaseException] = []

    def replica() -> None:
        try:
            made.append(ensure_partitions(pg, day(0), 5))
        except BaseException as error:  # collected for the assertion
            errors.append(error)

    threads = [threading.Thread(target=replica) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    names = [name for names in made for name in names]
    assert sorted(names) == [f"requests_p202701{d}" for d in range(10, 16)]


def test_a_record_far_off_lands_in_the_default_partition_and_moves_out_with_its_partition(pg: Engine) -> None:
    ensure_partitions(pg, day(0), 1)
    past = synthetic_record(1, start=datetime(2021, 6, 1, 8, tzinfo=UTC), prefix="past")
    future = synthetic_record(2, start=datetime(2099, 1, 1, tzinfo=UTC), prefix="future")
    now = synthetic_record(3, start=day(0, 5), prefix="now")
    assert write(pg, [past, future, now], "a") == 3  # nothing refused for its timestamp
    assert where_rows_are(pg) == {"requests_default": 2, "requests_p20270110": 1}
    assert ensure_partitions(pg, datetime(2021, 6, 1, tzinfo=UTC), 0) == ["requests_p20210601"]
    assert where_rows_are(pg) == {"requests_default": 1, "requests_p20270110": 1, "requests_p20210601": 1}
    with pg.connect() as conn:
        ids = set(conn.execute(select(RequestRow.request_id)).scalars())
    assert ids == {past.request_id, future.request_id, now.request_id}


def test_a_replayed_batch_is_stored_once(pg: Engine) -> None:
    ensure_partitions(pg, day(0), 0)
    batch = records_over(2, 10)  # day 0 in its partition, day 1 in the default one
    assert write(pg, batch, "first") == 20
    # The same records again under another batch id (the spool replayed after its batch ids expired).
    with pg.begin() as conn:
        again = write_batch(conn, batch, "replayed", "spool")
    assert (again.stored, again.duplicates) == (0, 20)
    assert count(pg) == 20
    assert where_rows_are(pg) == {"requests_p20270110": 10, "requests_default": 10}
    with pg.connect() as conn:
        assert conn.execute(text("SELECT sum(n_requests) FROM rollup_minute")).scalar_one() == 20


def test_expired_partitions_are_dropped_whole_each_in_a_fenced_transaction(pg: Engine) -> None:
    ensure_partitions(pg, day(0), 4)
    write(pg, records_over(5, 24), "days")
    fenced: list[str] = []

    def fence(conn: Connection) -> None:
        fenced.append(conn.execute(text("SHOW lock_timeout")).scalar_one())

    dropped = drop_expired_partitions(pg, day(3, 12), fence)
    assert [d.name for d in dropped] == ["requests_p20270110", "requests_p20270111", "requests_p20270112"]
    assert fenced == ["1s", "1s", "1s"]  # one transaction per partition, each with a bounded lock wait
    assert where_rows_are(pg) == {"requests_p20270113": 24, "requests_p20270114": 24}  # the edge day is retention's
    with pg.connect() as conn:
        assert conn.execute(text("SELECT to_regclass('requests_p20270110')")).scalar() is None  # gone, not detached


def test_a_failing_fence_keeps_the_partition_and_stops(pg: Engine) -> None:
    ensure_partitions(pg, day(0), 2)
    write(pg, records_over(3, 4), "days")
    calls = 0

    def fence(conn: Connection) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("the lease was taken over")

    with pytest.raises(RuntimeError, match="taken over"):
        drop_expired_partitions(pg, day(3), fence)
    assert where_rows_are(pg) == {"requests_p20270111": 4, "requests_p20270112": 4}


def test_a_partition_held_by_a_long_read_is_given_up_after_bounded_waits(
    pg: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(partitions, "DDL_LOCK_TIMEOUT_MS", 100)
    monkeypatch.setattr(partitions, "DDL_ATTEMPTS", 2)
    monkeypatch.setattr(partitions, "DDL_BACKOFF_S", 0.01)
    ensure_partitions(pg, day(0), 1)
    write(pg, records_over(2, 4), "days")
    with pg.connect() as reader:
        reader.execute(text("SELECT count(*) FROM requests"))  # a read in an open transaction holds its lock
        with pytest.raises(PartitionLockError, match="100 ms on each of 2 attempts"):
            drop_expired_partitions(pg, day(1))
        reader.rollback()
    assert where_rows_are(pg) == {"requests_p20270110": 4, "requests_p20270111": 4}
    assert [d.name for d in drop_expired_partitions(pg, day(1))] == ["requests_p20270110"]


def _partitions_read(engine: Engine, read: Callable[[], Any]) -> list[set[str]]:
    """For each statement ``read`` sends to requests, the partitions its plan reads."""
    sent: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        if "FROM requests" in statement:
            sent.append((statement, params))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        read()
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    plans = []
    with engine.connect() as conn:
        for statement, params in sent:
            plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + statement, params))
            names = set(conn.execute(text("SELECT relname FROM pg_class WHERE relname LIKE 'requests_%'")).scalars())
            plans.append({name for name in names if f" {name} " in plan or f" on {name}" in plan})
    return plans


def test_windowed_reads_touch_only_the_partitions_of_their_window(pg: Engine) -> None:
    ensure_partitions(pg, day(0), 4)
    write(pg, records_over(5, 48), "days")
    with pg.begin() as conn:
        conn.execute(text("ANALYZE requests"))

    def drift_sample(start: datetime, end: datetime) -> Callable[[], None]:
        def read() -> None:
            with pg.connect() as conn:
                assert len(sample_requests(conn, "chat", PAIR, start, end, 100)) > 0

        return read

    # The drift run's sample (its id pick and its rows) within one day, then across two.
    assert _partitions_read(pg, drift_sample(day(2, 6), day(2, 18))) == [{"requests_p20270112"}]
    assert _partitions_read(pg, drift_sample(day(1, 12), day(3))) == [{"requests_p20270111", "requests_p20270112"}]

    # The net-loss fallback's baseline sample, across workloads.
    def fallback() -> None:
        with pg.connect() as conn:
            assert len(sample_requests(conn, None, PAIR, day(3), day(4), 100, mode="holdout", any_drafter=True)) > 0

    assert _partitions_read(pg, fallback) == [{"requests_p20270113"}]
    # The dashboard's reads of requests (what-if inputs, request samples, current settings).
    reads = [
        lambda: dashboard_queries.speedup_inputs(pg, "code", day(4, 1), day(4, 20)),
        lambda: queries.request_samples(pg, "code", day(4, 1), day(4, 20)),
        lambda: dashboard_queries.current_settings(pg, day(4, 1), day(4, 20), workloads=["code"]),
    ]
    for read in reads:
        touched = _partitions_read(pg, read)
        assert touched and all(t == {"requests_p20270114"} for t in touched), touched
