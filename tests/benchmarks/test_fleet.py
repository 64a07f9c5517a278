"""benchmarks/fleet.py compares the two layouts of ``requests`` on what it claims to compare."""

from __future__ import annotations

import os

import pytest

from benchmarks.fleet import Outcome, lay_out, report
from monitor.store.engine import create_engine
from monitor.store.partitions import is_partitioned


@pytest.mark.parametrize("layout", ["partitioned", "plain"])
def test_each_layout_is_what_the_fleet_then_writes_into(pg_url: str, layout: str) -> None:
    lay_out(pg_url, layout)
    engine = create_engine(pg_url)
    with engine.connect() as conn:
        assert is_partitioned(conn) == (layout == "partitioned")
    engine.dispose()


def outcome(layout: str, sidecars: int, records: int, pg_share: float) -> Outcome:
    return Outcome(layout=layout, sidecars=sidecars, seconds=10.0, records=records, p99_ms=50.0,
                   per_sidecar=[records / 10.0 / sidecars] * sidecars, pg_share=pg_share, sidecar_share=0.5,
                   wal_bytes=records * 1000, leader_before="h:1:a", leader_after="h:2:b",
                   takeover_s=6.0 if sidecars > 1 else None, missing=0, stored=records, twice_run_ticks=0,
                   runs_by_leader={})  # fmt: skip


def test_the_report_sets_each_fleet_against_one_sidecar_and_against_the_plain_table() -> None:
    rows = report([
        outcome("partitioned", 1, 60_000, 0.10), outcome("plain", 1, 50_000, 0.10),
        outcome("partitioned", 2, 90_000, 0.25), outcome("plain", 2, 100_000, 0.25),
    ]).splitlines()  # fmt: skip
    two = next(r for r in rows if r.startswith("| partitioned | 2 |"))
    cells = [c.strip() for c in two.split("|")[1:-1]]
    # 9,000/s: 1.50x one partitioned sidecar, 0.90x two sidecars on the plain table; PostgreSQL used a
    # quarter of the machine's cores, so per core of it the fleet wrote 9,000 / (0.25 x cores).
    assert cells[2:5] == ["9,000", "1.50x", "0.90x"]
    assert cells[8] == f"{9_000 / (0.25 * (os.cpu_count() or 1)):,.0f}"
    assert cells[9] == "1,000"
    plain = next(r for r in rows if r.startswith("| plain | 2 |"))
    assert [c.strip() for c in plain.split("|")[1:-1]][4] == "n/a"
