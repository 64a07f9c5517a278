"""`draftwatch db partition` and `db unpartition` on populated PostgreSQL tables (monitor/store/repartition.py).

An installation whose requests and rollups held rows when migrations 0014 and 0016 ran keeps the
plain tables; the command converts them online: interrupted and resumed, with writes during the
conversion (by a connection whose statements are already prepared; rollup rows updated before and
after the copy passed them), to identical rows, identical reads (drift sampling and a drift run,
/v1/workloads through the API, the dashboard's rollup reads) and the model's layout; `db
unpartition` goes back the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from fastapi.testclient import TestClient
from sqlalchemy import select, text
from sqlalchemy.engine import Engine

from decoder.record import RequestRecord
from monitor.api.app import create_app
from monitor.commands.db import register
from monitor.drift.run import run_drift
from monitor.drift.sampling import sample_requests
from monitor.ingest.synthetic import synthetic_record
from monitor.scheduler.retention import apply_retention
from monitor.scheduler.settings import RetentionSettings
from monitor.store import migrate
from monitor.store.engine import create_engine
from monitor.store.models import Base, RequestRow, declared_for
from monitor.store.partitions import ROLLUP_PARTITION_DAYS, grid_start, is_partitioned, list_partitions
from monitor.store.reads import dashboard as dashboard_queries
from monitor.store.reads.results import Pair
from monitor.store.repartition import conversion_in_progress, convert
from monitor.store.writes.writer import write_batch
from tests.api.conftest import READ, auth, make_settings
from tests.store.legacy import write_at_old_revision

NOW = datetime.now(UTC).replace(second=0, microsecond=0)
START = NOW - timedelta(days=4, hours=3)
PAIR = Pair("qwen-coder-1.5b", "model", "qwen-coder-0.5b")
TABLES = ("requests", "rollup_minute", "rollup_bins")


def _records(count: int, start: datetime, prefix: str, spacing: timedelta) -> list[RequestRecord]:
    return [
        synthetic_record(
            i,
            workload=("chat", "code", "extract")[i % 3],
            start=start + i * spacing,
            spacing=timedelta(0),
            prefix=prefix,
            mode="holdout" if i % 10 == 3 else "speculative",
        )
        for i in range(count)
    ]


@pytest.fixture
def legacy(pg_url: str, caplog: pytest.LogCaptureFixture) -> Iterator[Engine]:
    """A database at head whose requests and rollups stayed unpartitioned: 1,200 requests over 4 days when 0014 ran."""
    engine = create_engine(pg_url)
    migrate.upgrade(engine, "0013")
    with engine.begin() as conn:
        write_at_old_revision(conn, _records(1200, START, "old", timedelta(minutes=5)), "old")
    with caplog.at_level(logging.WARNING, logger="monitor.store.migrate"):
        migrate.upgrade(engine)
    for migration, table in (("0014", "requests"), ("0016", "rollup_minute"), ("0016", "rollup_bins")):
        assert f"migration {migration}: {table} holds rows" in caplog.text
    assert "run `draftwatch db partition` to convert it online" in caplog.text
    with engine.connect() as conn:
        assert not any(is_partitioned(conn, table) for table in TABLES)
    try:
        yield engine
    finally:
        engine.dispose()


def _cli(db_url: str, *argv: str) -> int:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["db", "--database-url", db_url, *argv])
    return int(args.handler(args))


def _rows(engine: Engine, table: str = "requests") -> list[Any]:
    """Every row as a mapping: a converted table has its columns in the model's order, a migrated one has the
    columns later migrations added at its end."""
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text(f"SELECT * FROM {table} ORDER BY id"))]


def _reads(engine: Engine, tmp_path: Path, db_url: str) -> dict[str, Any]:
    """What the readers of requests and rollups answer: drift samples and a drift run, /v1/workloads, rollups."""
    out: dict[str, Any] = {}
    with engine.connect() as conn:
        for workload in ("chat", "code", None):
            sample = sample_requests(conn, workload, PAIR, START + timedelta(days=1), NOW, 200, any_drafter=True)
            out[f"sample {workload}"] = [repr(list(getattr(sample, f))) for f in sample.__dataclass_fields__]
    out["rollups"], out["bins"] = _rows(engine, "rollup_minute"), _rows(engine, "rollup_bins")
    day_one = START + timedelta(days=1)
    out["pairs"] = dashboard_queries.pair_summaries(engine, day_one, NOW)
    out["latency"] = dashboard_queries.latency_series(engine, "code", day_one, NOW, step=timedelta(hours=6))
    # Without the online detector, whose state one run moves on for the next.
    run = run_drift(
        engine, now=NOW, store=False, current=timedelta(days=1), reference=timedelta(days=3), detectors=False
    )
    out["drift"] = [repr(r) for r in run.results]
    with TestClient(create_app(make_settings(tmp_path, db_url))) as client:
        since = (START - timedelta(hours=1)).isoformat()
        response = client.get("/v1/workloads", params={"since": since, "until": NOW.isoformat()}, headers=auth(READ))
        assert response.status_code == 200
        out["workloads"] = response.json()
    return {key: _settled(value) for key, value in out.items()}


def _settled(value: Any) -> Any:
    """``value`` with every float to 12 significant digits: a sum of floats over rows read in another order (the
    partitioned layout scans its partitions in turn) may differ in its last bits, and SQL fixes no order."""
    if isinstance(value, float):
        return float(f"{value:.12g}")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _settled(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {key: _settled(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_settled(item) for item in value]
    return value


class Writer:
    """A recorder's connection, held across the conversion: the store's writer, its statements prepared by psycopg."""

    def __init__(self, pg_url: str) -> None:
        self.engine = create_engine(pg_url, connect_args={"prepare_threshold": 1})
        self.conn = self.engine.connect()
        self.batches = 0

    def insert(self, records: list[RequestRecord]) -> list[str]:
        self.batches += 1
        with self.conn.begin():
            outcome = write_batch(self.conn, records, f"writer-{self.batches}", "live")
        return [rec.request_id for rec in outcome.new]

    def close(self) -> None:
        self.conn.close()
        self.engine.dispose()


def test_db_partition_converts_online_resumably_to_identical_rows_and_reads(
    legacy: Engine, pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    writer = Writer(pg_url)
    for n in range(3):
        assert len(writer.insert(_records(2, NOW - timedelta(minutes=30 - n), f"w0{n}", timedelta(seconds=1)))) == 2

    # Interrupted after three batches of about 100 rows: the rest waits for the next run.
    assert _cli(pg_url, "partition", "--batch-rows", "100", "--max-batches", "3") == 0
    out = capsys.readouterr().out
    assert "paused in requests after 3 batches" in out and "run db partition again" in out
    with legacy.connect() as conn:
        assert conversion_in_progress(conn) and not is_partitioned(conn)
        copied = conn.execute(text("SELECT count(*) FROM requests_next")).scalar_one()
    assert 0 < copied < 1206
    # Retention leaves requests alone meanwhile (it would race the copy).
    assert "requests" not in apply_retention(legacy, RetentionSettings(requests_days=1), NOW)
    assert len(_rows(legacy)) == 1206

    # Written during the conversion: through the prepared INSERT, by the store's writer, a record far back.
    assert len(writer.insert(_records(6, NOW - timedelta(minutes=20), "w1", timedelta(minutes=1)))) == 6
    with legacy.begin() as conn:
        write_batch(conn, _records(30, NOW - timedelta(minutes=50), "during", timedelta(seconds=30)), "d", "sync")
        write_batch(conn, [synthetic_record(1, start=START - timedelta(days=40), prefix="straggler")], "s", "spool")
    before_rows, before_reads = _rows(legacy), _reads(legacy, tmp_path, pg_url)

    assert _cli(pg_url, "partition", "--batch-rows", "100") == 0
    out = capsys.readouterr().out
    assert "requests, rollup_minute, rollup_bins now partitioned" in out and "rows/s" in out and "ETA" in out
    assert all(f"{table}: copied" in out for table in TABLES)
    with legacy.connect() as conn:
        assert all(is_partitioned(conn, t) and not conversion_in_progress(conn, t) for t in TABLES)
        left = "SELECT relname FROM pg_class WHERE relname ~ '(requests|rollup_minute|rollup_bins).*_next'"
        assert conn.execute(text(left)).scalars().all() == []
        days = {p.start for p in list_partitions(conn) if p.start is not None}
        weeks = {t: {p.start for p in list_partitions(conn, t) if p.start is not None} for t in TABLES[1:]}
        opts = {"compare_type": True, "include_object": _ours}
        assert compare_metadata(MigrationContext.configure(conn, opts=opts), Base.metadata) == []
    assert {grid_start(START + timedelta(days=d), 1) for d in range(5)} <= days  # a partition for each day copied
    for table_weeks in weeks.values():  # and a week for each week of rollups
        assert {grid_start(START + timedelta(days=d), ROLLUP_PARTITION_DAYS) for d in range(5)} <= table_weeks
    with legacy.connect() as conn:  # the straggler, copied by the trigger, waits in the default partition
        where = "SELECT tableoid::regclass::text FROM requests WHERE request_id LIKE 'straggler%'"
        assert conn.execute(text(where)).scalar_one() == "requests_default"
    assert _rows(legacy) == before_rows
    assert _reads(legacy, tmp_path, pg_url) == before_reads

    # The writer's prepared INSERT goes on into the partitioned table; ids go on from the same sequence.
    assert len(writer.insert(_records(3, NOW - timedelta(minutes=5), "w2", timedelta(minutes=1)))) == 3
    assert writer.insert(_records(3, NOW - timedelta(minutes=5), "w2", timedelta(minutes=1))) == []  # stored once
    writer.close()
    with legacy.connect() as conn:
        ids = conn.execute(select(RequestRow.id).order_by(RequestRow.id.desc()).limit(3)).scalars().all()
    assert min(ids) > max(row["id"] for row in before_rows)
    assert _cli(pg_url, "partition") == 0
    assert "requests, rollup_minute, rollup_bins are already partitioned" in capsys.readouterr().out


def _ours(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    table = name if type_ == "table" else getattr(getattr(obj, "table", None), "name", None)
    return table in TABLES and (reflected or declared_for(obj, "postgresql"))


def test_rollup_rows_updated_while_their_table_converts_end_up_as_they_are(
    legacy: Engine, pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    writer = Writer(pg_url)
    writer.insert(_records(3, NOW - timedelta(minutes=30), "w0", timedelta(seconds=1)))  # its statements prepared
    # rollup_minute paused after two batches: its first minutes copied, the rest not yet.
    outcome = convert(legacy, partitioned=True, batch_rows=100, max_batches=2, tables=("rollup_minute", "rollup_bins"))
    assert (outcome.state, outcome.tables, outcome.batches) == ("paused", ("rollup_minute",), 2)
    with legacy.connect() as conn:
        assert conversion_in_progress(conn, "rollup_minute") and not conversion_in_progress(conn, "requests")
        watermark = conn.execute(text("SELECT watermark FROM rollup_minute_conversion")).scalar_one()
    # Retention leaves the table under conversion alone, not the others.
    settings = RetentionSettings(requests_days=0, drift_days=0, alerts_days=0, jobs_days=0, batches_days=0)
    assert set(apply_retention(legacy, settings, NOW)) == {"rollup_bins"}  # rollups_days 400

    # More requests in minutes that have rows: in copied minutes and in minutes still to copy (the same index gives
    # the same minute, workload and mode), and in new minutes; through the prepared statements and the store's writer.
    again = _records(1200, START, "again", timedelta(minutes=5))
    copied, to_copy = [r for r in again if r.ts_start < watermark], [r for r in again if r.ts_start >= watermark]
    assert copied and to_copy
    assert len(writer.insert([*copied[:3], *to_copy[:3]])) == 6
    with legacy.begin() as conn:
        fresh = _records(4, START + timedelta(minutes=2), "fresh", timedelta(minutes=5))
        write_batch(conn, [*copied[3:6], *to_copy[-3:], *fresh], "during", "sync")
    before = {table: _rows(legacy, table) for table in TABLES[1:]}

    assert _cli(pg_url, "partition", "--batch-rows", "100") == 0
    assert "requests, rollup_minute, rollup_bins now partitioned" in capsys.readouterr().out
    assert {table: _rows(legacy, table) for table in TABLES[1:]} == before
    assert len(writer.insert(_records(2, NOW - timedelta(minutes=3), "w1", timedelta(minutes=1)))) == 2
    writer.close()
    with legacy.connect() as conn:
        counted = conn.execute(text("SELECT sum(n_requests) FROM rollup_minute")).scalar_one()
    assert counted == len(_rows(legacy))  # every request counted once, through the swap


def test_db_unpartition_is_the_way_back(legacy: Engine, pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    original, rollups = _rows(legacy), (_rows(legacy, "rollup_minute"), _rows(legacy, "rollup_bins"))
    assert _cli(pg_url, "partition", "--batch-rows", "500") == 0
    assert _cli(pg_url, "unpartition", "--batch-rows", "500", "--keep-old") == 0
    assert "requests, rollup_minute, rollup_bins now unpartitioned" in capsys.readouterr().out
    with legacy.connect() as conn:
        assert not is_partitioned(conn)
        keys = set(
            conn.execute(text("SELECT conname FROM pg_constraint WHERE conrelid = 'requests'::regclass")).scalars()
        )
        indexes = set(
            conn.execute(text("SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = 'requests'::regclass"))
            .scalars()
            .all()
        )
        kept = conn.execute(text("SELECT count(*) FROM requests_old")).scalar_one()  # --keep-old: the partitioned one
    assert keys == {"pk_requests", "uq_requests_request_id"}
    assert indexes == keys | {
        "ix_requests_workload_ts",
        "ix_requests_pair_ts",
        "ix_requests_ts",
        "ix_requests_baseline_workload_ts",
        "ix_requests_baseline_target_ts",
    }
    assert kept == len(original)
    assert _rows(legacy) == original
    with legacy.connect() as conn:
        assert not any(is_partitioned(conn, table) for table in TABLES)
        rollup_keys = set(
            conn.execute(
                text("SELECT conname FROM pg_constraint WHERE conrelid IN ('rollup_minute'::regclass, "
                     "'rollup_bins'::regclass)")
            ).scalars()
        )  # fmt: skip
    assert rollup_keys == {"pk_rollup_minute", "uq_rollup_minute_key", "pk_rollup_bins", "uq_rollup_bins_key"}
    assert (_rows(legacy, "rollup_minute"), _rows(legacy, "rollup_bins")) == rollups
    # Back at the plain layout, the schema can go below 0014 (which then finds nothing to undo).
    assert migrate.downgrade(legacy, "0013") == "0013"
    below = _rows(legacy)  # without the columns migrations after 0013 added
    assert below == [{column: row[column] for column in below[0]} for row in original]
    assert (_rows(legacy, "rollup_minute"), _rows(legacy, "rollup_bins")) == rollups


def test_an_abandoned_conversion_leaves_requests_as_it_was(legacy: Engine, pg_url: str) -> None:
    original = _rows(legacy)
    assert _cli(pg_url, "partition", "--batch-rows", "100", "--max-batches", "2") == 0
    assert _cli(pg_url, "unpartition") == 1  # the other direction is refused while one is under way
    assert _cli(pg_url, "partition", "--abort") == 0
    with legacy.connect() as conn:
        assert not conversion_in_progress(conn) and not is_partitioned(conn)
        left = conn.execute(
            text(
                "SELECT count(*) FROM pg_class WHERE relname LIKE 'requests\\_next%' OR relname = 'requests_conversion'"
            )
        ).scalar_one()
        triggers = conn.execute(
            text("SELECT count(*) FROM pg_trigger WHERE tgrelid = 'requests'::regclass")
        ).scalar_one()
    assert (left, triggers) == (0, 0)
    with legacy.begin() as conn:
        write_batch(conn, _records(3, NOW, "after", timedelta(minutes=1)), "after", "sync")
    assert len(_rows(legacy)) == len(original) + 3


def test_db_partition_on_sqlite_says_it_is_postgresql_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(f"sqlite:///{tmp_path / 'dw.db'}", "partition") == 1
    assert "only PostgreSQL" in capsys.readouterr().err
