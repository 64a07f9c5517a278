"""Failure tests with real processes and real databases."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.engine import Engine

from monitor.ingest.recorder import Recorder
from monitor.ingest.settings import RecorderSettings
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from monitor.store.models import RequestRow, RollupMinuteRow
from tests.private_pg import PrivatePostgres
from tests.records import stream

REPO = Path(__file__).resolve().parents[2]


def child(url: str, spool: Path, progress: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.ingest.recorder_child", url, str(spool), "--progress", str(progress), *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def totals(engine: Engine) -> tuple[int, int, int]:
    with engine.connect() as conn:
        n = conn.execute(select(func.count()).select_from(RequestRow)).scalar_one()
        distinct = conn.execute(select(func.count(func.distinct(RequestRow.request_id)))).scalar_one()
        rolled = conn.execute(select(func.coalesce(func.sum(RollupMinuteRow.n_requests), 0))).scalar_one()
    return int(n), int(distinct), int(rolled)


def ids_in_db(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(select(RequestRow.request_id)).scalars())


@pytest.mark.slow
def test_four_processes_into_one_postgresql(pg_url: str, tmp_path: Path) -> None:
    engine = create_engine(pg_url)
    upgrade(engine)
    # Overlapping id ranges: most ids are sent by two processes at once.
    procs = [
        child(
            pg_url,
            tmp_path / f"spool{k}",
            tmp_path / f"progress{k}",
            "--first",
            str(k * 750),
            "--count",
            "1500",
            "--prefix",
            "p",
        )
        for k in range(4)
    ]
    stats = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        stats.append(json.loads(out.strip().splitlines()[-1]))
    expected = 750 * 3 + 1500  # ids 0 .. 3749
    assert totals(engine) == (expected, expected, expected)
    assert sum(s["written"] + s["replayed"] for s in stats) == expected
    assert sum(s["duplicates"] for s in stats) == 4 * 1500 - expected
    engine.dispose()


@pytest.fixture(scope="module")
def private_pg() -> Iterator[PrivatePostgres]:
    try:
        server = PrivatePostgres()
    except (RuntimeError, subprocess.CalledProcessError, KeyError) as error:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"cannot create a private PostgreSQL: {error}")
        pytest.skip(f"cannot create a private PostgreSQL: {error}")
    try:
        yield server
    finally:
        server.destroy()


@pytest.mark.slow
def test_private_postgresql_down_at_start_then_lost_mid_run(private_pg: PrivatePostgres, tmp_path: Path) -> None:
    engine = create_engine(private_pg.url)
    recorder = Recorder(
        engine,
        RecorderSettings(spool_dir=tmp_path / "spool", batch_size=100, flush_interval_s=0.05, retry_interval_s=0.2),
    )
    recorder.start()
    # 1. Down at start: everything spools.
    first = stream(500, prefix="early")
    for rec in first:
        recorder.record(rec)
    assert recorder.flush(20)
    assert recorder.stats().spooled == 500
    private_pg.start()
    upgrade(engine)
    assert recorder.wait_replayed(30)
    # 2. Lost mid-run: the server stops while records flow, and comes back.
    records = stream(3000, prefix="mid")
    for n, rec in enumerate(records):
        recorder.record(rec)
        if n == 1000:
            private_pg.stop("fast")
        if n == 2000:
            private_pg.start()
        if n % 100 == 0:
            time.sleep(0.01)
    assert recorder.flush(30)
    assert recorder.wait_replayed(30)
    recorder.close()
    stats = recorder.stats()
    assert stats.spooled > 500, "the mid-run outage should have spooled batches"
    assert totals(engine) == (3500, 3500, 3500)
    assert stats.written + stats.replayed == 3500 and stats.duplicates == 0
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
    engine.dispose()


@pytest.mark.slow
@pytest.mark.parametrize("database", ["up", "down"])
def test_kill_9_loses_nothing_reported(db_url: str, tmp_path: Path, database: str) -> None:
    if database == "down" and db_url.startswith("sqlite"):
        pytest.skip("the database-down variant runs on PostgreSQL (a database that does not exist yet)")
    engine = create_engine(db_url)
    child_url = db_url
    if database == "up":
        upgrade(engine)
    else:
        child_url = db_url + "_missing"
    progress = tmp_path / "progress"
    proc = child(child_url, tmp_path / "spool", progress, "--count", "100000", "--rate", "4000")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if progress.exists() and progress.read_text().count("\n") >= 2000:
            break
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    reported = progress.read_text().splitlines()
    assert len(reported) >= 2000
    if database == "down":
        upgrade(engine)  # the records went to the spool; the next process uses a reachable database
    with Recorder(engine, RecorderSettings(spool_dir=tmp_path / "spool")) as recovery:
        assert recovery.wait_replayed(30)
    stored = ids_in_db(engine)
    assert len(stored) == len(set(stored))
    assert set(reported) <= set(stored)
    n, distinct, rolled = totals(engine)
    assert n == distinct == rolled
    engine.dispose()
