"""Per-minute rollups computed from records, as additive deltas the writer upserts.

A delta is computed only from the records a transaction actually inserted (duplicates excluded),
and applied in that same transaction with ``count = count + delta``: rollups stay exactly equal to
what the ``requests`` table holds, whichever process wrote the rows.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from decoder.record import RequestRecord
from monitor.store import bins
from monitor.store.lengths import prompt_bucket

SUM_COLUMNS: Final = (
    "n_requests",
    "n_errors",
    "sum_prompt_tokens",
    "sum_output_tokens",
    "sum_spec_steps",
    "sum_draft_tokens",
    "sum_accepted_tokens",
    "n_drafting",
    "sum_acceptance_rate",
    "n_timed",
    "sum_ms_per_token",
    "sum_timed_latency_ms",
    "sum_timed_output_tokens",
    "n_ttft",
    "sum_ttft_ms",
)

RollupKey = tuple[datetime, str, str, str, str, str]


def minute_of(ts: datetime) -> datetime:
    """The UTC minute a timestamp falls in (the rollup bucket).

    >>> minute_of(datetime(2026, 3, 1, 12, 34, 56, 789, tzinfo=UTC)).isoformat()
    '2026-03-01T12:34:00+00:00'
    """
    ts = ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)
    return ts.replace(second=0, microsecond=0)


def minute_after(ts: datetime) -> datetime:
    """The first minute boundary at or after ``ts``: where a range of whole rollup buckets ends.

    >>> minute_after(datetime(2026, 3, 1, 12, 34, 5, tzinfo=UTC)).isoformat()
    '2026-03-01T12:35:00+00:00'
    >>> minute_after(datetime(2026, 3, 1, 12, 34, tzinfo=UTC)).isoformat()
    '2026-03-01T12:34:00+00:00'
    """
    start = minute_of(ts)
    return start if start == ts else start + timedelta(minutes=1)


def rollup_key(rec: RequestRecord) -> RollupKey:
    return (
        minute_of(rec.ts_start),
        rec.workload,
        rec.target_model,
        rec.drafter,
        rec.draft_model or "",
        rec.mode,
    )


@dataclass(slots=True)
class _Sums:
    values: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SUM_COLUMNS, 0))
    bins: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))


@dataclass(frozen=True, slots=True)
class RollupDelta:
    """Rows to add into ``rollup_minute`` and ``rollup_bins``, sorted by key (a fixed lock order)."""

    minutes: list[dict[str, Any]]
    bins: list[dict[str, Any]]


def compute(records: Iterable[RequestRecord]) -> RollupDelta:
    """Aggregate records into per-minute deltas."""
    sums: dict[RollupKey, _Sums] = defaultdict(_Sums)
    for rec in records:
        entry = sums[rollup_key(rec)]
        v = entry.values
        v["n_requests"] += 1
        v["n_errors"] += rec.finish_reason == "error"
        v["sum_prompt_tokens"] += rec.prompt_tokens
        v["sum_output_tokens"] += rec.output_tokens
        v["sum_spec_steps"] += rec.num_spec_steps
        v["sum_draft_tokens"] += rec.num_draft_tokens
        v["sum_accepted_tokens"] += rec.num_accepted_tokens
        if rec.num_draft_tokens > 0:
            v["n_drafting"] += 1
            v["sum_acceptance_rate"] += rec.num_accepted_tokens / rec.num_draft_tokens
        if rec.latency_ms is not None and rec.output_tokens > 0:
            v["sum_timed_latency_ms"] += rec.latency_ms
            v["sum_timed_output_tokens"] += rec.output_tokens
        decode = rec.decode_ms_per_token
        if decode is not None:
            v["n_timed"] += 1
            v["sum_ms_per_token"] += decode
            entry.bins[(bins.MS_PER_TOKEN, bins.value_bin(decode))] += 1
        if rec.ttft_ms is not None:
            v["n_ttft"] += 1
            v["sum_ttft_ms"] += rec.ttft_ms
            entry.bins[(bins.TTFT_MS, bins.value_bin(rec.ttft_ms))] += 1
        for position, count in enumerate(rec.accepted_per_position):
            if count:
                entry.bins[(bins.ACCEPTED_AT_POSITION, position)] += count
        for length, count in enumerate(rec.acceptance_histogram):
            if count:
                entry.bins[(bins.ACCEPTANCE_LENGTH, length)] += count
        if rec.num_draft_tokens > 0:
            bucket = prompt_bucket(rec.prompt_tokens)
            entry.bins[(bins.PROMPT_DRAFTING, bucket)] += 1
            entry.bins[(bins.PROMPT_DRAFTED, bucket)] += rec.num_draft_tokens
            entry.bins[(bins.PROMPT_ACCEPTED, bucket)] += rec.num_accepted_tokens
        if rec.drafted_by_span is not None and rec.accepted_by_span is not None:
            for span, (drafted, accepted) in enumerate(zip(rec.drafted_by_span, rec.accepted_by_span, strict=True)):
                if drafted:
                    entry.bins[(bins.SPAN_DRAFTING, span)] += 1
                    entry.bins[(bins.SPAN_DRAFTED, span)] += drafted
                    entry.bins[(bins.SPAN_ACCEPTED, span)] += accepted
    minutes: list[dict[str, Any]] = []
    bin_rows: list[dict[str, Any]] = []
    for key in sorted(sums):
        base = dict(zip(("bucket", "workload", "target_model", "drafter", "draft_model", "mode"), key, strict=True))
        minutes.append({**base, **sums[key].values})
        for (metric, index), count in sorted(sums[key].bins.items()):
            bin_rows.append({**base, "metric": metric, "bin": index, "count": count})
    return RollupDelta(minutes, bin_rows)
