"""Read-side queries against figures computed directly from the records."""

from __future__ import annotations

import itertools
import math
import statistics
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from decoder.record import RequestRecord
from monitor.ingest.recorder import Recorder
from monitor.ingest.settings import RecorderSettings
from monitor.store.reads import queries
from tests.records import T0, stream

END = T0 + timedelta(days=1)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@pytest.fixture
def loaded(engine: Engine, tmp_path: Path) -> list[RequestRecord]:
    records = stream(600, spacing=timedelta(seconds=2)) + stream(
        100, prefix="h", mode="holdout", spacing=timedelta(seconds=12)
    )
    with Recorder(engine, RecorderSettings(spool_dir=tmp_path / "spool")) as recorder:
        recorder.store_batch(records)
    return records


def test_workload_summaries_match_the_records(engine: Engine, loaded: list[RequestRecord]) -> None:
    summaries = {s.workload: s for s in queries.workload_summaries(engine, T0, END)}
    assert sorted(summaries) == ["chat", "code"]
    for workload, summary in summaries.items():
        mine = [r for r in loaded if r.workload == workload]
        spec = [r for r in mine if r.mode == "speculative"]
        hold = [r for r in mine if r.mode == "holdout"]
        assert summary.requests == len(mine)
        assert summary.requests_by_mode == {"holdout": len(hold), "speculative": len(spec)}
        drafted = sum(r.num_draft_tokens for r in mine)
        assert summary.acceptance_rate_tokens == pytest.approx(sum(r.num_accepted_tokens for r in mine) / drafted)
        assert summary.acceptance_rate_requests == pytest.approx(
            statistics.mean(r.acceptance_rate or 0.0 for r in spec)
        )
        steps = sum(r.num_spec_steps for r in mine)
        assert summary.mean_acceptance_length == pytest.approx(1 + sum(r.num_accepted_tokens for r in mine) / steps)
        per_token = [r.decode_ms_per_token for r in mine]
        for q, got in (
            (0.5, summary.ms_per_token_p50),
            (0.95, summary.ms_per_token_p95),
            (0.99, summary.ms_per_token_p99),
        ):
            assert got == pytest.approx(quantile(per_token, q), rel=0.05)  # type: ignore[arg-type]
        assert summary.ttft_p95_ms == pytest.approx(quantile([r.ttft_ms for r in mine], 0.95), rel=0.05)  # type: ignore[misc]
        tokens = sum(r.output_tokens for r in mine)
        assert summary.tokens_per_second == pytest.approx(tokens * 1000 / sum(r.latency_ms for r in mine))  # type: ignore[misc]
        hold_ms = statistics.mean(r.decode_ms_per_token or 0.0 for r in hold)
        speedup = hold_ms / statistics.mean(r.decode_ms_per_token or 0.0 for r in spec)
        assert summary.measured_speedup == pytest.approx(speedup)
        assert summary.holdout_requests == len(hold)
    only_spec = queries.workload_summary(engine, "code", T0, END, mode="speculative")
    assert only_spec is not None and only_spec.requests == len(
        [r for r in loaded if r.workload == "code" and r.mode == "speculative"]
    )
    assert queries.workload_summary(engine, "nope", T0, END) is None


def test_time_series_and_ranges(engine: Engine, loaded: list[RequestRecord]) -> None:
    points = queries.time_series(engine, "code", T0, END, step=timedelta(minutes=5))
    code = [r for r in loaded if r.workload == "code"]
    assert sum(p.requests for p in points) == len(code)
    assert all((p.bucket - T0) % timedelta(minutes=5) == timedelta(0) for p in points)
    first = [r for r in code if r.ts_start < T0 + timedelta(minutes=5)]
    assert points[0].requests == len(first)
    window = queries.workload_summary(engine, "code", T0 + timedelta(minutes=5), T0 + timedelta(minutes=10))
    assert window is not None
    assert window.requests == len([r for r in code if timedelta(minutes=5) <= r.ts_start - T0 < timedelta(minutes=10)])


def test_positions_lengths_samples_and_catalogue(engine: Engine, loaded: list[RequestRecord]) -> None:
    code = [r for r in loaded if r.workload == "code" and r.mode == "speculative"]
    positions = queries.position_acceptance(engine, "code", T0, END)
    steps = sum(r.num_spec_steps for r in code)
    assert [p.accepted for p in positions] == [sum(r.accepted_per_position[i] for r in code) for i in range(4)]
    assert positions[0].rate == pytest.approx(positions[0].accepted / steps)
    assert all(a.rate >= b.rate for a, b in itertools.pairwise(positions))  # type: ignore[operator]
    lengths = queries.acceptance_length_histogram(engine, "code", T0, END)
    assert [b.steps for b in lengths] == [sum(r.acceptance_histogram[j] for r in code) for j in range(5)]
    assert sum(b.share for b in lengths) == pytest.approx(1.0)
    samples = queries.request_samples(engine, "code", T0, END, mode="speculative")
    assert [s.request_id for s in samples] == [r.request_id for r in sorted(code, key=lambda r: r.ts_start)]
    assert samples[0].acceptance_rate == pytest.approx(code[0].acceptance_rate)
    assert queries.workloads(engine, T0, END) == ["chat", "code"]
    assert queries.pairs(engine, T0, END) == [
        queries.Pair("qwen-coder-1.5b", "model", "qwen-coder-0.5b"),
        queries.Pair("qwen-coder-1.5b", "none", None),
    ]
    events = queries.deployment_events(engine, T0, END)
    assert {(e.kind, e.role) for e in events} == {("first_seen", "target"), ("first_seen", "draft")}


def test_measured_speedup_is_the_decode_phase_of_its_construction(engine: Engine, tmp_path: Path) -> None:
    """Speculation decodes at 10 ms per token and plain at 15, so the speedup is 1.5 by construction.

    Every request first reads a long prompt for 800 ms, and speculative answers are short (20 tokens)
    where plain ones are long (200): latency / output tokens would say 49.5 ms against 19 ms, a
    speedup of 0.38 that is all prompt reading.
    """
    from tests.records import api_record

    counts = ("num_speculative_tokens", "num_spec_steps", "num_draft_tokens", "num_accepted_tokens")
    plain_counts: dict[str, object] = {name: 0 for name in counts}
    plain_counts.update(accepted_per_position=[], acceptance_histogram=[])

    def scripted(i: int, mode: str, output: int, per_token: float) -> RequestRecord:
        return api_record(
            f"{mode}-{i}",
            ts_start=T0 + timedelta(seconds=i),
            ts_end=T0 + timedelta(seconds=i + 5),
            workload="rag",
            mode=mode,
            output_tokens=output,
            ttft_ms=800.0,
            latency_ms=800.0 + per_token * (output - 1),
            **({} if mode == "speculative" else plain_counts),
        )

    records = [scripted(i, "speculative", 20, 10.0) for i in range(40)]
    records += [scripted(i, "holdout", 200, 15.0) for i in range(40, 60)]
    with Recorder(engine, RecorderSettings(spool_dir=tmp_path / "spool")) as recorder:
        recorder.store_batch(records)
    summary = queries.workload_summary(engine, "rag", T0, END)
    assert summary is not None and summary.measured_speedup == pytest.approx(1.5)
    assert summary.ms_per_token_mean == pytest.approx((40 * 10.0 + 20 * 15.0) / 60)
