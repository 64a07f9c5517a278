"""The reads of baseline traffic (holdout and plain requests) use migration 0008's partial indexes on PostgreSQL.

Without them the dashboard's cost ratios walked every speculative request of a workload's range to
find its few holdout ones, and the drift run's net-loss fallback scanned ``requests`` whole: on 10M
requests 5.7 s of the overview page and 13 s of a 14 s drift run (benchmarks/store_scale.py).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

from decoder.record import Mode
from monitor.drift.sampling import sample_requests
from monitor.ingest.synthetic import synthetic_record
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from monitor.store.reads import dashboard as dashboard_queries
from monitor.store.reads.results import Pair
from monitor.store.writes.writer import write_batch

START = datetime(2026, 3, 1, tzinfo=UTC)
PAIR = Pair("qwen-coder-1.5b", "model", "qwen-coder-0.5b")


def _fill(engine: Engine, count: int = 6000) -> None:
    records = []
    for i in range(count):
        mode: Mode = "holdout" if i % 20 == 3 else "speculative"
        workload = ("chat", "code", "extract")[i % 3]
        records.append(synthetic_record(i, workload=workload, start=START, spacing=timedelta(seconds=1), mode=mode))
    with engine.begin() as conn:
        write_batch(conn, records, "fill", "sync")
        conn.exec_driver_sql("ANALYZE requests")


def _plans(engine: Engine, read: Callable[[], Any], table: str = "requests") -> list[str]:
    """The plan of every statement ``read`` sends, planned with sequential scans discouraged (a small table)."""
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
        conn.exec_driver_sql("SET enable_seqscan = off")
        for statement, params in sent:
            rows = conn.exec_driver_sql("EXPLAIN " + statement, params).all()
            plans.append("\n".join(r[0] for r in rows))
    return plans


def test_baseline_reads_use_the_partial_indexes(pg_url: str) -> None:
    engine = create_engine(pg_url)
    upgrade(engine)
    _fill(engine)
    end = START + timedelta(hours=2)

    plans = _plans(engine, lambda: dashboard_queries.speedup_inputs(engine, "code", START, end))
    baseline = [p for p in plans if "holdout" in p]
    assert baseline and all("ix_requests_baseline_workload_ts" in p for p in baseline), plans

    def fallback() -> None:
        with engine.connect() as conn:
            sample = sample_requests(conn, None, PAIR, START, end, 2000, mode=("holdout", "plain"), any_drafter=True)
        assert len(sample) == 300  # every holdout request: the index holds them all

    plans = _plans(engine, fallback)
    # On this small table either partial index serves (one target); on 10M rows the target's one does.
    assert len(plans) == 1 and "ix_requests_baseline_" in plans[0], plans
    engine.dispose()
