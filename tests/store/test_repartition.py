"""`draftwatch db partition` and `db unpartition` on a populated PostgreSQL table (monitor/store/repartition.py).

An installation whose requests held rows when migration 0014 ran keeps the plain table; the
command converts it online: interrupted and resumed, with writes during the conversion (by a
connection whose insert is already a prepared statement), to identical rows, identical reads
(drift sampling and a drift run, /v1/workloads through the API, the rollups) and the model's
layout; `db unpartition` goes back the same way.
"""

from __future__ import annotations

import argparse
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
from monitor.store.partitions import grid_start, is_partitioned, list_partitions
from monitor.store.reads.results import Pair
from monitor.store.repartition import conversion_in_progress
from monitor.store.writes.writer import write_batch
from tests.api.conftest import READ, auth, make_settings

NOW = datetime.now(UTC).replace(second=0, microsecond=0)
START = NOW - timedelta(days=4, hours=3)
PAIR = Pair("qwen-coder-1.5b", "model", "qwen-coder-0.5b")


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
    """A database at head whose requests stayed unpartitioned: it held 1,200 rows over 4 days when 0014 ran."""
    engine = create_engine(pg_url)
    migrate.upgrade(engine, "0013")
    with engine.begin() as conn:
        write_batch(conn, _records(1200, START, "old", timedelta(minutes=5)), "old", "sync")
    with caplog.at_level(logging.WARNING, logger="monitor.store.migrate"):
        migrate.upgrade(engine)
    assert "run `draftwatch db partition` to convert it online" in caplog.text
    with engine.connect() as conn:
        assert not is_partitioned(conn)
    try:
        yield engine
    finally:
        engine.dispose()


def _cli(db_url: str, *argv: str) -> int:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["db", "--database-url", db_url, *argv])
    return int(args.handler(args))


def _rows(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text("SELECT * FROM requests ORDER BY id"))]


def _reads(engine: Engine, tmp_path: Path, db_url: str) -> dict[str, Any]:
    """What the readers of requests and rollups answer: drift samples and a drift run, /v1/workloads, rollups."""
    out: dict[str, Any] = {}
    with engine.connect() as conn:
        for workload in ("chat", "code", None):
            sample = sample_requests(conn, workload, PAIR, START + timedelta(days=1), NOW, 200, any_drafter=True)
            out[f"sample {workload}"] = [repr(list(getattr(sample, f))) for f in sample.__dataclass_fields__]
        out["rollups"] = conn.execute(text("SELECT * FROM rollup_minute ORDER BY id")).all()
        out["bins"] = conn.execute(text("SELECT * FROM rollup_bins ORDER BY id")).all()
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
    return out


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
    assert "paused after 3 batches" in out and "run db partition again" in out
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
    assert "requests is now partitioned" in out and "rows/s" in out and "ETA" in out
    with legacy.connect() as conn:
        assert is_partitioned(conn) and not conversion_in_progress(conn)
        assert conn.execute(text("SELECT to_regclass('requests_next')")).scalar() is None
        days = {p.start for p in list_partitions(conn) if p.start is not None}
        opts = {"compare_type": True, "include_object": _ours}
        assert compare_metadata(MigrationContext.configure(conn, opts=opts), Base.metadata) == []
    assert {grid_start(START + timedelta(days=d), 1) for d in range(5)} <= days  # a partition for each day copied
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
    assert min(ids) > max(row[0] for row in before_rows)
    assert _cli(pg_url, "partition") == 0
    assert "already partitioned" in capsys.readouterr().out


def _ours(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    table = name if type_ == "table" else getattr(getattr(obj, "table", None), "name", None)
    return table == "requests" and (reflected or declared_for(obj, "postgresql"))


def test_db_unpartition_is_the_way_back(legacy: Engine, pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    original = _rows(legacy)
    assert _cli(pg_url, "partition", "--batch-rows", "500") == 0
    assert _cli(pg_url, "unpartition", "--batch-rows", "500", "--keep-old") == 0
    assert "requests is now unpartitioned" in capsys.readouterr().out
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
    # Back at the plain layout, the schema can go below 0014 (which then finds nothing to undo).
    assert migrate.downgrade(legacy, "0013") == "0013"
    assert _rows(legacy) == original


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
