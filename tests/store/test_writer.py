"""Storage on both dialects: round trip, idempotency, exact rollups, version events, rejection."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from decoder.record import RecordError, RequestRecord
from monitor.ingest.recorder import Recorder
from monitor.ingest.settings import RecorderSettings
from monitor.store.models import DeploymentEventRow, RecorderBatchRow, RequestRow, RollupBinRow, RollupMinuteRow
from monitor.store.writes.rows import from_row
from tests.records import T0, api_record, stream


def count(engine: Engine, table: type) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def read_all(engine: Engine) -> dict[str, RequestRecord]:
    with engine.connect() as conn:
        return {row.request_id: from_row(row) for row in conn.execute(select(RequestRow.__table__))}


def test_records_round_trip_exactly(engine: Engine, tmp_path: Path) -> None:
    records = [
        api_record("a"),
        api_record("b", draft_model=None, drafter="ngram", draft_version=None, error=None, ttft_ms=None),
        api_record("c\ttab\\slash\nnewline", error="boom: \u00e9\u4e2d", finish_reason="error", stopped_mid_step=True),
        *stream(50),
    ]
    with Recorder(engine, RecorderSettings(spool_dir=tmp_path / "spool")) as recorder:
        assert recorder.store_batch(records) == (len(records), 0, 0)
    stored = read_all(engine)
    assert stored == {r.request_id: r for r in records}
    assert all(r.ts_start.tzinfo is not None for r in stored.values())


def test_duplicates_are_counted_and_ignored(engine: Engine, tmp_path: Path) -> None:
    with Recorder(engine, RecorderSettings(spool_dir=tmp_path / "spool")) as recorder:
        assert recorder.store_batch([api_record("x"), api_record("y")]) == (2, 0, 0)
        assert recorder.store_batch([api_record("y"), api_record("z"), api_record("z")]) == (1, 2, 0)
        for rec in stream(30):
            recorder.record(rec)
        for rec in stream(30):
            recorder.record(rec)
        assert recorder.flush(10)
        stats = recorder.stats()
    assert (stats.written, stats.duplicates) == (33, 32)
    assert count(engine, RequestRow) == 33
    with engine.connect() as conn:
        assert conn.execute(select(func.sum(RollupMinuteRow.n_requests))).scalar_one() == 33


def test_rollups_equal_the_requests_table(engine: Engine, tmp_path: Path) -> None:
    records = stream(400, spacing=timedelta(seconds=3)) + stream(60, prefix="h", mode="holdout")
    with Recorder(engine, RecorderSettings(spool_dir=tmp_path / "spool", batch_size=37)) as recorder:
        for rec in records:
            recorder.record(rec)
        recorder.store_batch(records[:100])  # all duplicates: rollups must not move
    with engine.connect() as conn:
        minutes = conn.execute(select(RollupMinuteRow.__table__)).mappings().all()
        bins = conn.execute(select(RollupBinRow.__table__)).mappings().all()
    by_key: dict[tuple[object, ...], list[RequestRecord]] = {}
    for rec in records:
        key = (rec.ts_start.replace(second=0, microsecond=0), rec.workload, rec.mode)
        by_key.setdefault(key, []).append(rec)
    assert len(minutes) == len(by_key)
    for row in minutes:
        group = by_key[(row["bucket"], row["workload"], row["mode"])]
        assert row["n_requests"] == len(group)
        assert row["sum_accepted_tokens"] == sum(r.num_accepted_tokens for r in group)
        assert row["sum_draft_tokens"] == sum(r.num_draft_tokens for r in group)
        assert row["sum_spec_steps"] == sum(r.num_spec_steps for r in group)
        assert row["sum_output_tokens"] == sum(r.output_tokens for r in group)
        rates = [r.num_accepted_tokens / r.num_draft_tokens for r in group if r.num_draft_tokens]
        assert row["n_drafting"] == len(rates)
        assert math.isclose(row["sum_acceptance_rate"], sum(rates), rel_tol=1e-9, abs_tol=1e-9)
        assert math.isclose(row["sum_ttft_ms"], sum(r.ttft_ms or 0 for r in group), rel_tol=1e-9)
    position_total = sum(b["count"] for b in bins if b["metric"] == "accepted_at_position")
    assert position_total == sum(r.num_accepted_tokens for r in records)
    length_total = sum(b["count"] for b in bins if b["metric"] == "acceptance_length")
    assert length_total == sum(r.num_spec_steps for r in records)
    assert sum(b["count"] for b in bins if b["metric"] == "ms_per_token") == len(records)


def test_a_new_version_is_a_deployment_event(engine: Engine, tmp_path: Path) -> None:
    with Recorder(engine, RecorderSettings(spool_dir=tmp_path / "spool")) as recorder:
        recorder.store_batch([api_record("a"), api_record("b")])
        recorder.store_batch(
            [
                api_record(
                    "c",
                    target_version="v2",
                    ts_start=T0 + timedelta(hours=1),
                    ts_end=T0 + timedelta(hours=1, seconds=1),
                )
            ]
        )
    with engine.connect() as conn:
        events = conn.execute(
            select(DeploymentEventRow.kind, DeploymentEventRow.role, DeploymentEventRow.version).order_by(
                DeploymentEventRow.id
            )
        ).all()
    assert sorted(events[:2]) == [("first_seen", "draft", "d1"), ("first_seen", "target", "v1")]
    assert events[2] == ("version_changed", "target", "v2")


BAD = [
    ("num_draft_tokens", {"num_draft_tokens": -1}),
    ("num_accepted_tokens", {"num_accepted_tokens": 13}),
    ("latency_ms", {"latency_ms": float("nan")}),
    ("ttft_ms", {"ttft_ms": float("inf")}),
    ("workload", {"workload": "x" * 65}),
    ("workload", {"workload": "bad tag!"}),
    ("workload", {"workload": ""}),
    ("accepted_per_position", {"accepted_per_position": [4, 2, 0, 1]}),
    ("acceptance_histogram", {"acceptance_histogram": [0, 2, 2]}),
    ("accepted_per_position", {"accepted_per_position": [4, 2, 1.0]}),
    ("target_model", {"target_model": "nul\x00byte"}),
    ("error", {"error": "e" * 10_000}),
    ("request_id", {"request_id": ""}),
    ("mode", {"mode": "turbo"}),
    ("ts_end", {"ts_end": T0 - timedelta(seconds=1)}),
    ("prompt_tokens", {"prompt_tokens": True}),
]


def test_bad_records_are_rejected_naming_the_field(engine: Engine, tmp_path: Path) -> None:
    with Recorder(engine, RecorderSettings(spool_dir=tmp_path / "spool")) as recorder:
        for field, change in BAD:
            bad = replace(api_record("bad"), **change)  # type: ignore[arg-type]
            with pytest.raises(RecordError) as caught:
                recorder.record(bad)
            assert caught.value.field == field, change
            with pytest.raises(RecordError) as caught:
                recorder.store_batch([api_record("good-1"), bad, api_record("good-2")])
            assert caught.value.field == field, change
            assert "record 1" in str(caught.value)
        assert recorder.stats().rejected == 2 * len(BAD)
    assert count(engine, RequestRow) == 0  # nothing partial
    assert count(engine, RecorderBatchRow) == 0
