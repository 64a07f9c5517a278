"""A store of proxied records only (an engine that reports no draft counts): the pages show dashes, never None.

The proxy in front of an engine that returns no per-request speculation figures records timings
and token counts only: acceptance, acceptance length, the speedup and γ are unknown. Streamlit
draws a missing cell as the word None unless the table has a placeholder, and γ came out as 0.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from dashboard import status
from decoder.record import RequestRecord
from monitor.drift.run import run_drift
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from monitor.store.reads import dashboard as dashboard_queries
from monitor.store.reads import queries
from monitor.store.writes.writer import write_batch
from tests.dashboard.conftest import AppFactory, Store

DASH = "—"


def proxied(now: datetime) -> list[RequestRecord]:
    """Two workloads of proxied requests over the last day only (no previous window to compare with)."""
    rng = random.Random(7)
    out = []
    for workload, count in (("chat", 120), ("code", 40)):
        for i in range(count):
            ts = now - timedelta(hours=23) + timedelta(hours=23) * i / count
            ttft, tokens = rng.uniform(20, 60), rng.randint(20, 80)
            latency = ttft + tokens * rng.uniform(15, 25)
            out.append(
                RequestRecord(
                    f"{workload}-{i}", ts, ts + timedelta(milliseconds=latency), workload, "llama-8b", "upstream",
                    prompt_tokens=rng.randint(50, 500), output_tokens=tokens, ttft_ms=ttft, latency_ms=latency,
                    source="proxy:vllm", upstream_inflight=1,
                )
            )  # fmt: skip
    return sorted(out, key=lambda r: r.ts_start)


@pytest.fixture(scope="module")
def engine_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    url = f"sqlite:///{tmp_path_factory.mktemp('dash') / 'engine-only.db'}"
    engine = create_engine(url)
    upgrade(engine)
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    with engine.begin() as conn:
        write_batch(conn, proxied(now), "engine-only", "sync")
    run_drift(engine, now=now + timedelta(minutes=1), detectors=False)
    yield Store(url, engine, now)
    engine.dispose()


def missing(cell: Any) -> bool:
    return cell is None or (isinstance(cell, float) and math.isnan(cell))


def shown(at: AppTest) -> list[list[dict[str, str]]]:
    """Every table on the page as the grid draws it: a missing cell is the table's placeholder, else its value."""
    tables = []
    for frame in at.dataframe:
        placeholder = frame.proto.placeholder or "None"  # Streamlit's own word for a missing value
        records = frame.value.to_dict("records")
        tables.append(
            [{column: placeholder if missing(cell) else str(cell) for column, cell in row.items()} for row in records]
        )
    return tables


def test_the_overview_table_has_no_none_and_leaves_gamma_empty(app: AppFactory, engine_only: Store) -> None:
    at = app(engine_only.url, "overview")
    assert not at.exception, [e.value for e in at.exception]
    (rows,) = [rows for rows in shown(at) if rows and "γ" in rows[0]]
    assert [r["Workload"] for r in rows] == ["chat", "code"]
    for row in rows:
        assert "None" not in row.values(), row
        assert row["γ"] == ""
        # The five figures nobody reported, each a dash (its column's help says why).
        for column in ("Acceptance", "Δ acceptance (pts)", "Mean accept. length", "Speedup", "Δ p95"):
            assert row[column] == DASH, (column, row)
        assert row["Pays?"] == "not measured" and "baseline" in row["Why"]


def test_overview_rows_know_gamma_is_unknown_not_zero(engine_only: Store) -> None:
    assert engine_only.now is not None
    start, end = engine_only.now - timedelta(days=1), engine_only.now + timedelta(minutes=1)
    current = queries.workload_summaries(engine_only.engine, start, end, lengths_too=False)
    settings = dashboard_queries.current_settings(engine_only.engine, start, end)
    assert {s.gamma for s in settings.values()} == {0}  # what the records carry
    rows = status.overview_rows(current, [], settings, {}, [])
    assert [r.gamma for r in rows] == [None, None]
    assert [t["γ"] for t in status.table(rows)] == ["", ""]


@pytest.mark.parametrize("page", ["drift", "pairs", "workload"])
def test_the_other_pages_draw_no_none_either(app: AppFactory, engine_only: Store, page: str) -> None:
    at = app(engine_only.url, page)
    assert not at.exception, [e.value for e in at.exception]
    tables = shown(at)
    assert tables or page == "workload"  # the workload page shows its figures as metrics
    for rows in tables:
        for row in rows:
            assert "None" not in row.values(), row
    assert all(m.value != "None" for m in at.metric)
