"""The scheduler: lease fencing in process, and two real ``draftwatch scheduler`` processes on one
PostgreSQL database (one runs jobs, ``kill -9`` of the leader hands over within the TTL, no tick twice)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from monitor.drift.models import DriftRunRow
from monitor.drift.run import run_drift
from monitor.scheduler.jobs import drift_job, run_tick, tick_of
from monitor.scheduler.lease import Lease, LeaseLostError
from monitor.scheduler.models import JobRunRow, LeaseRow
from monitor.scheduler.service import SchedulerService
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from tests.alerting import make_settings

ROOT = Path(__file__).resolve().parents[2]
TTL_S = 2.0


def _count(engine: Engine, table: type) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def test_lease_fences_a_paused_former_leader(engine: Engine, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, engine.url.render_as_string(hide_password=False))
    a, b = Lease(engine, "a", 1.5), Lease(engine, "b", 1.5)
    assert a.acquire_or_renew() and not b.acquire_or_renew()
    tick = tick_of(datetime.now(UTC), timedelta(minutes=5))
    assert run_tick(engine, settings, a, "drift", tick, drift_job) == "ok"
    time.sleep(1.6)  # a is "paused" past its TTL; b takes over with a higher epoch
    assert b.acquire_or_renew() and b.epoch == 2
    with pytest.raises(LeaseLostError):
        run_drift(engine, settings.drift, fence=a.fence)
    assert _count(engine, DriftRunRow) == 1  # the stale leader's run was rolled back
    assert run_tick(engine, settings, a, "drift", tick + timedelta(minutes=5), drift_job) == "skipped"
    assert run_tick(engine, settings, b, "drift", tick, drift_job) == "skipped"  # a tick runs once
    assert not a.acquire_or_renew() and a.epoch is None
    b.release()
    assert a.acquire_or_renew() and a.epoch == 3  # epochs only grow


def _start(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "monitor.commands", "--log-level", "INFO", "scheduler", "--jobs", "drift"]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log.open("wb"))


def _wait(what: str, predicate: object, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():  # type: ignore[operator]
            return time.monotonic() - start
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_on_an_empty_database_the_scheduler_waits_for_the_schema_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A sidecar starts its scheduler before its API migrates: the heartbeat warned "no such table".
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    engine = create_engine(url)
    settings = make_settings(tmp_path, url, DRAFTWATCH_SCHEDULER_HEARTBEAT_S="0.1")
    caplog.set_level(logging.INFO, logger="monitor.scheduler")
    service = SchedulerService(settings, engine, jobs=["drift"]).start()
    try:
        time.sleep(0.5)  # five heartbeats
        assert service.lease.epoch is None
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
        assert sum("waits for the schema (at empty" in r.getMessage() for r in caplog.records) == 1
        upgrade(engine)
        _wait("the lease", lambda: service.lease.epoch is not None, timeout=5)
    finally:
        service.stop()
        engine.dispose()


def test_two_scheduler_processes_one_leader_takeover_after_kill(pg_url: str, tmp_path: Path) -> None:
    engine = create_engine(pg_url)
    upgrade(engine)
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "DRAFTWATCH_DATA_DIR": str(tmp_path / "data"),
        "DRAFTWATCH_DATABASE_URL": pg_url,
        "DRAFTWATCH_SCHEDULER_LEASE_TTL_S": str(TTL_S),
        "DRAFTWATCH_SCHEDULER_HEARTBEAT_S": "0.3",
        "DRAFTWATCH_SCHEDULER_DRIFT_INTERVAL": "1s",
        "DRAFTWATCH_WEBHOOKS": "[]",
    }
    procs = [_start(env, tmp_path / f"s{i}.log") for i in range(2)]
    try:

        def ok_runs(holder: str | None = None) -> int:
            with engine.connect() as conn:
                q = select(func.count()).where(JobRunRow.job == "drift", JobRunRow.status == "ok")
                return int(conn.execute(q.where(JobRunRow.holder == holder) if holder else q).scalar_one())

        def leader() -> str | None:
            with engine.connect() as conn:
                return conn.execute(select(LeaseRow.holder)).scalar()

        _wait("three drift runs", lambda: ok_runs() >= 3, 40)
        first = leader()
        assert first is not None
        with engine.connect() as conn:
            assert set(conn.execute(select(JobRunRow.holder)).scalars()) == {first}  # exactly one works
        pid = int(first.split(":")[1])
        assert pid in {p.pid for p in procs}
        os.kill(pid, signal.SIGKILL)
        killed_at = datetime.now(UTC)
        took = _wait("a new leader", lambda: leader() not in (None, first), 20)
        assert took <= TTL_S + 1.5, f"takeover took {took:.1f} s with a {TTL_S} s lease"
        second = leader()
        assert second is not None
        _wait("drift runs by the new leader", lambda: ok_runs(second) >= 2, 20)
        survivor = next(p for p in procs if p.pid != pid)
        survivor.send_signal(signal.SIGTERM)
        assert survivor.wait(timeout=20) == 0
        with engine.connect() as conn:
            runs = conn.execute(select(JobRunRow.tick, JobRunRow.holder, JobRunRow.status, JobRunRow.started_at)
                                .where(JobRunRow.job == "drift")).all()  # fmt: skip
            stored = conn.execute(select(func.count()).select_from(DriftRunRow)).scalar_one()
        ticks = [r.tick for r in runs]
        assert len(ticks) == len(set(ticks))  # no tick twice
        assert stored == sum(r.status == "ok" for r in runs)  # one stored drift run per successful tick, no more
        assert {r.holder for r in runs} == {first, second}
        assert not [r for r in runs if r.holder == first and r.started_at > killed_at]
        assert {r.status for r in runs if r.holder == first} <= {"ok", "abandoned"}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        engine.dispose()
