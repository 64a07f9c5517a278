"""The partitioned requests and rollup tables on PostgreSQL (migrations 0014 and 0016, monitor/store/partitions.py).

Partitions are made ahead and by range, replicas making them at once make each once, a record far
off lands in the default partition and moves out when its partition is made, a replayed batch is
stored once and its rollups added once, into the partition of their minute, expired partitions are
detached and dropped whole (fenced, bounded in lock time), and a windowed read's plan touches only
the partitions of its window, of requests and of the rollups. SQLite is unchanged.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, func, select, text
from sqlalchemy.engine import Connection, Engine

from decoder.record import RequestRecord
from monitor.drift.sampling import sample_requests, window_counts
from monitor.ingest.synthetic import synthetic_record
from monitor.store import bins, migrate
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from monitor.store.models import RequestRow
from monitor.store.partitions import (
    ROLLUP_PARTITION_DAYS,
    TABLES,
    PartitionLockError,
    drop_expired_partitions,
    ensure_all_partitions,
    ensure_partitions,
    grid_start,
    is_partitioned,
    list_partitions,
    partition_name,
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


ROLLUP_INDEXES = {
    "rollup_minute": {"pk_rollup_minute", "uq_rollup_minute_key", "ix_rollup_minute_workload_bucket"},
    "rollup_bins": {"pk_rollup_bins", "uq_rollup_bins_key", "ix_rollup_bins_workload_metric_bucket"},
}


@pytest.fixture
def pg(pg_url: str) -> Iterator[Engine]:
    """A migrated PostgreSQL database whose partitioned tables have only their default partitions (tests make more)."""
    engine = create_engine(pg_url)
    upgrade(engine)
    with engine.begin() as conn:
        for table in TABLES:
            for partition in list_partitions(conn, table.name):
                if not partition.is_default:  # the days and weeks from today that the upgrade made
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
        keys = keys_of(conn, "requests")
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


def keys_of(conn: Connection, table: str) -> dict[str, str]:
    """``table``'s primary and unique keys: name to its columns in order, comma-separated."""
    rows = conn.execute(
        text(
            "SELECT conname, array_to_string(array(SELECT a.attname FROM unnest(c.conkey) WITH ORDINALITY k(n, i) "
            "JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n ORDER BY k.i), ',') "
            "FROM pg_constraint c WHERE conrelid = to_regclass(:t) AND contype IN ('p', 'u')"
        ),
        {"t": table},
    )
    return {str(name): str(columns) for name, columns in rows}


def indexes_of(conn: Connection, table: str) -> set[str]:
    query = text("SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = to_regclass(:t)")
    return set(conn.execute(query, {"t": table}).scalars())


def test_a_fresh_install_partitions_the_rollups_by_week_with_their_keys_and_indexes(pg_url: str) -> None:
    engine = create_engine(pg_url)
    upgrade(engine)
    week = grid_start(datetime.now(UTC), ROLLUP_PARTITION_DAYS)
    with engine.connect() as conn:
        layout = {
            table: (is_partitioned(conn, table), keys_of(conn, table), indexes_of(conn, table),
                    {p.name: (p.start, indexes_of(conn, p.name)) for p in list_partitions(conn, table)})
            for table in ROLLUP_INDEXES
        }  # fmt: skip
    engine.dispose()
    key = "bucket,workload,target_model,drafter,draft_model,mode"
    # The primary key holds the partition key now; the rollup key held it already and is unchanged.
    assert layout["rollup_minute"][:2] == (True, {"pk_rollup_minute": "id,bucket", "uq_rollup_minute_key": key})
    bins_keys = {"pk_rollup_bins": "id,bucket", "uq_rollup_bins_key": f"{key},metric,bin"}
    assert layout["rollup_bins"][:2] == (True, bins_keys)
    for table, (_, _, parent_indexes, found) in layout.items():
        assert parent_indexes == ROLLUP_INDEXES[table]
        # The week holding today and the one holding database.partitions_ahead_days (7) ahead, and the default one.
        assert {name: start for name, (start, _) in found.items()} == {
            partition_name(week, table): week,
            partition_name(week + timedelta(days=7), table): week + timedelta(days=7),
            f"{table}_default": None,
        }
        for name, (_, indexes) in found.items():
            assert indexes == {f"{index}_{name.removeprefix(table + '_')}" for index in ROLLUP_INDEXES[table]}, name


def test_migration_0016_goes_back_to_plain_rollup_tables_with_their_rows_and_leaves_populated_ones_alone(
    pg: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    ensure_all_partitions(pg, day(0), 7)
    write(pg, [*records_over(3, 5), synthetic_record(9, start=day(30), prefix="far")], "rows")  # the last: default

    def rollups() -> list[Any]:
        with pg.connect() as conn:
            return [conn.execute(text(f"SELECT * FROM {t} ORDER BY id")).all() for t in ROLLUP_INDEXES]

    written = rollups()
    assert migrate.downgrade(pg, "0015") == "0015"
    with pg.connect() as conn:
        assert not any(is_partitioned(conn, table) for table in ROLLUP_INDEXES) and is_partitioned(conn)
        keys = {table: keys_of(conn, table) for table in ROLLUP_INDEXES}
        assert {t: indexes_of(conn, t) for t in ROLLUP_INDEXES} == ROLLUP_INDEXES
    assert keys["rollup_minute"]["pk_rollup_minute"] == "id" and keys["rollup_bins"]["pk_rollup_bins"] == "id"
    assert rollups() == written
    with caplog.at_level(logging.WARNING, logger="monitor.store.migrate"):
        upgrade(pg)
    assert "migration 0016: rollup_minute holds rows, so it stays unpartitioned" in caplog.text
    with pg.connect() as conn:
        assert not any(is_partitioned(conn, table) for table in ROLLUP_INDEXES)
    assert write(pg, records_over(1, 3, prefix="after", first=1), "after") == 3  # the writer's upsert, plain again
    with pg.connect() as conn:
        assert conn.execute(text("SELECT sum(n_requests) FROM rollup_minute")).scalar_one() == 19


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


def rollup_rows(engine: Engine) -> list[tuple[str, datetime, int]]:
    """Each row of rollup_minute: its partition, minute and requests, by minute (a key twice would show twice)."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT tableoid::regclass::text, bucket, n_requests FROM rollup_minute ORDER BY 2"))
        return [(name, bucket, int(n)) for name, bucket, n in rows]


def ttft_counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT tableoid::regclass::text, sum(count) FROM rollup_bins WHERE metric = :m GROUP BY 1"),
            {"m": bins.TTFT_MS},
        )
        return {name: int(n) for name, n in rows}


def test_rollups_are_added_once_into_the_partition_of_their_minute(pg: Engine) -> None:
    ensure_all_partitions(pg, day(0), 0)  # requests' day 0, the rollups' week holding it (from 2027-01-07)
    weeks = [partition_name(grid_start(day(n), 7), "rollup_minute") for n in (0, 7)]
    assert weeks == ["rollup_minute_p20270107", "rollup_minute_p20270114"]

    def minute(n: int, prefix: str, day_: int) -> list[RequestRecord]:  # n requests in one minute, one rollup key
        return [synthetic_record(i, start=day(day_, 1), spacing=timedelta(0), prefix=prefix) for i in range(n)]

    first = minute(3, "a", 0) + minute(1, "a-next-week", 7)  # the second week has no partition yet
    assert write(pg, first, "a") == 4
    assert rollup_rows(pg) == [(weeks[0], day(0, 1), 3), ("rollup_minute_default", day(7, 1), 1)]
    more = minute(2, "b", 0)
    assert write(pg, more, "b") == 2  # the writer's upsert adds into the row of the minute, in its partition
    assert rollup_rows(pg) == [(weeks[0], day(0, 1), 5), ("rollup_minute_default", day(7, 1), 1)]
    # Replayed under another batch id (the spool after its batch ids expired): stored once, counted once.
    with pg.begin() as conn:
        again = write_batch(conn, first + more, "replayed", "spool")
    assert (again.stored, again.duplicates) == (0, 6)
    assert rollup_rows(pg) == [(weeks[0], day(0, 1), 5), ("rollup_minute_default", day(7, 1), 1)]
    assert ttft_counts(pg) == {"rollup_bins_p20270107": 5, "rollup_bins_default": 1}

    # The second week's partitions made: its rows move out of the default partitions, and a later batch of the
    # same minute adds into the moved row, not into a second one.
    assert ensure_all_partitions(pg, day(7), 0) == ["requests_p20270117", weeks[1], "rollup_bins_p20270114"]
    assert write(pg, minute(2, "c", 7), "c") == 2
    assert rollup_rows(pg) == [(weeks[0], day(0, 1), 5), (weeks[1], day(7, 1), 3)]
    assert ttft_counts(pg) == {"rollup_bins_p20270107": 5, "rollup_bins_p20270114": 3}


def test_expired_partitions_are_dropped_whole_each_in_a_fenced_transaction(pg: Engine) -> None:
    ensure_partitions(pg, day(0), 4)
    write(pg, records_over(5, 24), "days")
    fenced: list[str] = []

    def fence(conn: Connection) -> None:
        fenced.append(conn.execute(text("SHOW lock_timeout")).scalar_one())

    dropped = drop_expired_partitions(pg, day(3, 12), fence)
    assert [d.name for d in dropped] == ["requests_p20270110", "requests_p20270111", "requests_p20270112"]
    assert fenced == ["50ms", "50ms", "50ms"]  # one transaction per partition, each with a bounded lock wait
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


def test_a_partition_held_by_a_long_read_is_given_up_after_bounded_waits(pg: Engine) -> None:
    ensure_partitions(pg, day(0), 1)
    write(pg, records_over(2, 4), "days")
    with pg.connect() as reader:
        reader.execute(text("SELECT count(*) FROM requests"))  # a read in an open transaction holds its lock
        with pytest.raises(PartitionLockError, match=r"held past 50 ms on each of \d+ attempts over 0.3 s"):
            drop_expired_partitions(pg, day(1), wait_s=0.3)
        reader.rollback()
    assert where_rows_are(pg) == {"requests_p20270110": 4, "requests_p20270111": 4}
    assert [d.name for d in drop_expired_partitions(pg, day(1))] == ["requests_p20270110"]


def _partitions_read(engine: Engine, read: Callable[[], Any], table: str = "requests") -> list[set[str]]:
    """For each statement ``read`` sends to ``table``, the partitions its plan reads."""
    sent: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        if f"FROM {table}" in statement:
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
            like = {"p": f"{table}\\_%"}
            names = set(conn.execute(text("SELECT relname FROM pg_class WHERE relname LIKE :p"), like).scalars())
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


def rollup_reads(engine: Engine, start: datetime, end: datetime) -> list[Callable[[], Any]]:
    """The readers of the rollups over ``[start, end)``: /v1/workloads', the dashboard's, the drift run's counts."""

    def drift_counts() -> None:  # its reference and current windows, halves of this one
        with engine.connect() as conn:
            window_counts(conn, start, start + (end - start) / 2, end)

    hour = timedelta(hours=1)
    return [
        lambda: queries.workload_summaries(engine, start, end),
        lambda: queries.time_series(engine, "code", start, end, step=hour),
        lambda: queries.position_acceptance(engine, "code", start, end),
        lambda: queries.workloads(engine, start, end),
        lambda: queries.pairs(engine, start, end),
        lambda: dashboard_queries.pair_summaries(engine, start, end),
        lambda: dashboard_queries.latency_series(engine, "code", start, end, step=hour),
        lambda: dashboard_queries.current_settings(engine, start, end),
        drift_counts,
    ]


def test_windowed_rollup_reads_touch_only_the_partitions_of_their_window(pg: Engine) -> None:
    ensure_all_partitions(pg, day(0), 14)  # the rollups' weeks from 2027-01-07, 01-14 and 01-21
    write(pg, records_over(15, 8), "days")
    with pg.begin() as conn:
        conn.execute(text("ANALYZE rollup_minute, rollup_bins"))
    windows = {
        (day(5, 1), day(5, 20)): {"p20270114"},  # within a week
        (day(2), day(5)): {"p20270107", "p20270114"},  # across two
    }
    for (start, end), weeks in windows.items():
        for read in rollup_reads(pg, start, end):
            touched = {table: _partitions_read(pg, read, table) for table in ROLLUP_INDEXES}
            assert any(touched.values()), f"{read} read neither"
            for table, plans in touched.items():
                assert all(t == {f"{table}_{week}" for week in weeks} for t in plans), (table, plans)
