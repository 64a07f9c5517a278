"""Record builders for the monitor tests."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from decoder.record import RequestRecord
from monitor.ingest.synthetic import synthetic_record

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def api_record(request_id: str = "r-1", **changes: Any) -> RequestRecord:
    """A small valid record from an external source (no embedded output-token invariant)."""
    base = RequestRecord(
        request_id=request_id,
        ts_start=T0,
        ts_end=T0 + timedelta(milliseconds=500),
        workload="chat",
        target_model="qwen-coder-1.5b",
        drafter="model",
        draft_model="qwen-coder-0.5b",
        target_version="v1",
        draft_version="d1",
        mode="speculative",
        num_speculative_tokens=3,
        prompt_tokens=20,
        output_tokens=12,
        num_spec_steps=4,
        num_draft_tokens=12,
        num_accepted_tokens=7,
        accepted_per_position=[4, 2, 1],
        acceptance_histogram=[0, 2, 1, 1],
        ttft_ms=40.0,
        latency_ms=500.0,
        draft_ms=100.0,
        verify_ms=300.0,
        temperature=0.7,
        top_p=0.95,
        finish_reason="stop",
        source="api",
        prompt_hash="abc123",
    )
    return replace(base, **changes)


def stream(count: int, *, prefix: str = "s", start: datetime = T0, **kwargs: Any) -> list[RequestRecord]:
    """``count`` synthetic records alternating between two workloads."""
    return [
        synthetic_record(i, workload=("code", "chat")[i % 2], prefix=prefix, start=start, **kwargs)
        for i in range(count)
    ]
