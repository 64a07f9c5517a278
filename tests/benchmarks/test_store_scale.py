"""benchmarks/store_scale.py's generator: its COPY rows are valid records, and the rollups it copies beside them
are exactly what the store's writer (monitor/store/rollups.py) computes from those records."""

from __future__ import annotations

import itertools
import math
from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select

from benchmarks import store_scale
from benchmarks.store_scale import (
    BATCH_COLUMNS,
    BATCH_SIZE,
    REQUEST_COLUMNS,
    Plan,
    batch_lines,
    generate_chunk,
    request_lines,
    rollup_lines,
)
from decoder.record import COUNT_FIELDS, MEASURE_FIELDS, OUTPUT_SPAN_EDGES, RequestRecord
from monitor.store import rollups
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from monitor.store.models import RecorderBatchRow, RequestRow, RollupBinRow
from monitor.store.writes.rows import from_row, validate

INTS = set(COUNT_FIELDS)
FLOATS = set(MEASURE_FIELDS)


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def _record(line: str) -> RequestRecord:
    values: dict[str, object] = {}
    for name, raw in zip(REQUEST_COLUMNS, line.split("\t"), strict=True):
        if name == "ingested_at":
            continue
        value: object = None if raw == "\\N" else raw
        if name in ("ts_start", "ts_end"):
            value = _time(raw)
        elif name in INTS:
            value = int(raw)
        elif name in FLOATS:
            value = float(raw)
        elif name in ("accepted_per_position", "acceptance_histogram", "drafted_by_span", "accepted_by_span"):
            value = [int(x) for x in raw.strip("[]").split(",") if x]
        elif name == "stopped_mid_step":
            value = raw == "t"
        values[name] = value
    return validate(RequestRecord(**values))  # type: ignore[arg-type]


def test_generated_rollups_equal_the_writers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_scale, "CHUNK_ROWS", 500)
    plan = Plan(records=3000, days=1, workloads=12, seed=3, anchor=datetime(2026, 3, 2, tzinfo=UTC))
    chunks = plan.chunks()
    assert chunks[0][0] == 0 and chunks[-1][1] == plan.records and len(chunks) > 2
    assert all(a[1] == b[0] for a, b in itertools.pairwise(chunks))
    minute = plan.offsets_us(0, plan.records) // 60_000_000
    assert all(minute[b - 1] != minute[b] for _, b in chunks[:-1])  # whole minutes: their rollups are final
    number, (first, stop) = 1, chunks[1]
    data = generate_chunk(plan, number, first, stop)
    records = [_record(line) for line in request_lines(plan, data).splitlines()]
    assert len(records) == stop - first
    assert {r.mode for r in records} == {"speculative", "holdout"}
    assert len({(r.target_model, r.drafter, r.draft_model) for r in records}) == 5  # 3 pairs, 2 holdout keys
    # Span counts as the embedded decoder reports them: zeros for holdout, and speculative requests long
    # enough to reach the second span draft there (the rollups below then carry span bins too).
    assert all(r.drafted_by_span == [0, 0, 0] for r in records if r.mode == "holdout")
    reaching = [r for r in records if r.mode == "speculative" and r.output_tokens > OUTPUT_SPAN_EDGES[0] + 8]
    assert reaching and all(r.drafted_by_span and r.drafted_by_span[1] > 0 for r in reaching)
    assert all(r.drafted_by_span and r.drafted_by_span[2] == 0 for r in records if r.output_tokens < 100)

    minutes_text, bins_text = rollup_lines(plan, data)
    delta = rollups.compute(records)
    key_names = ("bucket", "workload", "target_model", "drafter", "draft_model", "mode")
    want_minutes = {tuple(m[k] for k in key_names): m for m in delta.minutes}
    have_minutes = {}
    for line in minutes_text.splitlines():
        fields = line.split("\t")
        key = (_time(fields[0]), *fields[1:6])
        have_minutes[key] = dict(zip(rollups.SUM_COLUMNS, map(float, fields[6:]), strict=True))
    assert have_minutes.keys() == want_minutes.keys()
    for key, sums in have_minutes.items():
        for column in rollups.SUM_COLUMNS:
            assert math.isclose(sums[column], want_minutes[key][column], rel_tol=1e-12, abs_tol=1e-9), (key, column)

    want_bins = {(*(b[k] for k in key_names), b["metric"], b["bin"]): b["count"] for b in delta.bins}
    have_bins = {}
    for line in bins_text.splitlines():
        fields = line.split("\t")
        have_bins[(_time(fields[0]), *fields[1:7], int(fields[7]))] = int(fields[8])
    assert have_bins == want_bins
    assert {key[6] for key in have_bins} >= {"span_drafting", "span_drafted", "span_accepted"}

    # The recorder's batch markers: one per BATCH_SIZE requests, each committed when its last request ended.
    markers = [dict(zip(BATCH_COLUMNS, line.split("\t"), strict=True)) for line in batch_lines(data).splitlines()]
    assert sum(int(m["n_records"]) for m in markers) == len(records)
    assert len(markers) == -(-len(records) // BATCH_SIZE) and len({m["batch_id"] for m in markers}) == len(markers)
    for k, marker in enumerate(markers):
        batch = records[k * BATCH_SIZE : (k + 1) * BATCH_SIZE]
        assert _time(marker["committed_at"]) == max(r.ts_end for r in batch) and marker["origin"] == "live"


def test_a_chunk_is_made_again_identically() -> None:
    """The retention measurement copies the deleted day back by generating its chunks again."""
    plan = Plan(records=2000, days=2, workloads=5, seed=0, anchor=datetime(2026, 3, 2, tzinfo=UTC))
    first, stop = plan.chunks()[0]
    assert request_lines(plan, generate_chunk(plan, 0, first, stop)) == request_lines(
        plan, generate_chunk(plan, 0, first, stop)
    )


def test_a_small_store_is_generated_into_postgresql(pg_url: str) -> None:
    """The whole generator on a few thousand requests: COPY takes the span lists and the batch markers, and the
    span bins copied beside them add up to the stored requests' drafts."""
    engine = create_engine(pg_url)
    upgrade(engine)
    engine.dispose()
    plan = Plan(records=3000, days=1, workloads=6, seed=5, anchor=datetime(2026, 3, 2, tzinfo=UTC))
    dsn = f"host=127.0.0.1 port=5432 user=postgres dbname={pg_url.rsplit('/', 1)[1]}"
    store_scale.generate(plan, dsn)
    engine = create_engine(pg_url)
    with engine.connect() as conn:
        markers = conn.execute(select(func.count(), func.sum(RecorderBatchRow.n_records))).one()
        spans = conn.execute(select(func.count()).where(RequestRow.drafted_by_span.is_not(None))).scalar_one()
        drafted = conn.execute(select(func.sum(RequestRow.num_draft_tokens))).scalar_one()
        accepted = conn.execute(select(func.sum(RequestRow.num_accepted_tokens))).scalar_one()
        by_metric = dict(
            conn.execute(select(RollupBinRow.metric, func.sum(RollupBinRow.count)).group_by(RollupBinRow.metric)).all()
        )
        recorded = [from_row(row) for row in conn.execute(RequestRow.__table__.select()).all()]
    engine.dispose()
    assert tuple(markers) == (sum(-(-(b - a) // BATCH_SIZE) for a, b in plan.chunks()), plan.records)
    assert spans == plan.records and all(validate(r) for r in recorded)
    assert (by_metric["span_drafted"], by_metric["span_accepted"]) == (drafted, accepted)
