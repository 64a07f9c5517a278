"""Read-side queries shared by the API, the drift tests and the dashboard.

Aggregates come from the per-minute rollups (``rollup_minute``, ``rollup_bins``), so they cost the
same for a thousand records as for millions. A time range selects the minute buckets that start
in ``[floor_minute(start), end)``: pass minute-aligned bounds for exact ranges. Latency
percentiles are read from fixed log buckets (within about 4.5 %, see :mod:`monitor.store.bins`).
Per-request values, which the drift tests need as samples, come from the ``requests`` table.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, func, select
from sqlalchemy.engine import Engine

from decoder.record import decode_ms_per_token
from monitor.store import bins, lengths
from monitor.store.models import DeploymentEventRow, RequestRow, RollupBinRow, RollupMinuteRow
from monitor.store.reads.results import (
    DeploymentEvent,
    LengthAcceptance,
    LengthBin,
    Pair,
    PositionAcceptance,
    RequestSample,
    SeriesPoint,
    Sums,
    WorkloadSummary,
)
from monitor.store.rollups import SUM_COLUMNS, minute_of

__all__ = [
    "DeploymentEvent",
    "LengthAcceptance",
    "LengthBin",
    "Pair",
    "PositionAcceptance",
    "RequestSample",
    "SeriesPoint",
    "Sums",
    "WorkloadSummary",
    "acceptance_length_histogram",
    "by_length",
    "deployment_events",
    "pairs",
    "position_acceptance",
    "request_samples",
    "time_series",
    "workload_summaries",
    "workload_summary",
    "workloads",
]

M = RollupMinuteRow
B = RollupBinRow


def _filters(
    table: Any, start: datetime, end: datetime, workload: str | None, pair: Pair | None, mode: str | None
) -> ColumnElement[bool]:
    clauses = [table.bucket >= minute_of(start), table.bucket < end]
    if workload is not None:
        clauses.append(table.workload == workload)
    if pair is not None:
        clauses += [
            table.target_model == pair.target_model,
            table.drafter == pair.drafter,
            table.draft_model == (pair.draft_model or ""),
        ]
    if mode is not None:
        clauses.append(table.mode == mode)
    return and_(*clauses)


def _sum_select(*group: Any) -> Select[Any]:
    return select(*group, *[func.sum(getattr(M, c)) for c in SUM_COLUMNS])


_FLOAT_SUMS = frozenset(c for c in SUM_COLUMNS if c.startswith("sum_") and c.endswith(("_ms", "_rate", "_token")))


def _to_sums(values: Sequence[Any]) -> Sums:
    # PostgreSQL's SUM(bigint) is NUMERIC (Decimal in Python): bring every figure back to int/float.
    figures: dict[str, Any] = {
        c: (float(v or 0) if c in _FLOAT_SUMS else int(v or 0)) for c, v in zip(SUM_COLUMNS, values, strict=True)
    }
    return Sums(**figures)


def workload_summaries(
    engine: Engine,
    start: datetime,
    end: datetime,
    *,
    workload: str | None = None,
    pair: Pair | None = None,
    mode: str | None = None,
    lengths_too: bool = True,
) -> list[WorkloadSummary]:
    """Per-workload aggregates over ``[start, end)``, sorted by workload.

    ``mode`` restricts the latency, acceptance and throughput figures (e.g. to ``speculative``);
    ``requests_by_mode`` and ``measured_speedup`` always look at every mode. ``by_prompt_length``
    and ``by_output_position`` come from the same rollup bins (:func:`by_length`); without
    ``lengths_too`` they are left empty and their bins unread, which a reader of every workload
    over days wants (they triple the bins read: 12.6 s against 5.2 s for the dashboard's overview
    of 7 days on 10M requests, benchmarks/store_scale.py).
    """
    wanted = [bins.MS_PER_TOKEN, bins.TTFT_MS, *((*bins.BY_PROMPT, *bins.BY_SPAN) if lengths_too else ())]
    by_mode: dict[str, dict[str, Sums]] = defaultdict(dict)
    hist: dict[tuple[str, str], dict[int, int]] = defaultdict(lambda: defaultdict(int))
    with engine.connect() as conn:
        rows = conn.execute(
            _sum_select(M.workload, M.mode)
            .where(_filters(M, start, end, workload, pair, None))
            .group_by(M.workload, M.mode)
        )
        for row in rows:
            by_mode[row[0]][row[1]] = _to_sums(row[2:])
        bin_rows = conn.execute(
            select(B.workload, B.metric, B.bin, func.sum(B.count))
            .where(
                _filters(B, start, end, workload, pair, mode),
                B.metric.in_(wanted),
            )
            .group_by(B.workload, B.metric, B.bin)
        )
        for wl, metric, index, count in bin_rows:
            hist[(wl, metric)][index] += int(count)
    summaries = []
    for wl in sorted(by_mode):
        modes = by_mode[wl]
        selected = [s for m, s in modes.items() if mode is None or m == mode]
        total = sum(selected, Sums())
        ms = hist[(wl, bins.MS_PER_TOKEN)]
        ttft = hist[(wl, bins.TTFT_MS)]
        spec, holdout = modes.get("speculative"), modes.get("holdout")
        speedup = None
        if spec and holdout and spec.ms_per_token_mean and holdout.ms_per_token_mean:
            speedup = holdout.ms_per_token_mean / spec.ms_per_token_mean
        summaries.append(
            WorkloadSummary(
                workload=wl,
                requests=total.n_requests,
                errors=total.n_errors,
                requests_by_mode={m: s.n_requests for m, s in sorted(modes.items())},
                acceptance_rate_tokens=total.acceptance_rate_tokens,
                acceptance_rate_requests=total.acceptance_rate_requests,
                mean_acceptance_length=total.mean_acceptance_length,
                ms_per_token_mean=total.ms_per_token_mean,
                ms_per_token_p50=bins.quantile(ms, 0.50),
                ms_per_token_p95=bins.quantile(ms, 0.95),
                ms_per_token_p99=bins.quantile(ms, 0.99),
                ttft_p50_ms=bins.quantile(ttft, 0.50),
                ttft_p95_ms=bins.quantile(ttft, 0.95),
                tokens_per_second=total.tokens_per_second,
                measured_speedup=speedup,
                holdout_requests=holdout.n_requests if holdout else 0,
                by_prompt_length=(
                    by_length(lengths.PROMPT_EDGES, *(hist[(wl, m)] for m in bins.BY_PROMPT)) if lengths_too else []
                ),
                by_output_position=(
                    by_length(lengths.OUTPUT_SPAN_EDGES, *(hist[(wl, m)] for m in bins.BY_SPAN)) if lengths_too else []
                ),
            )
        )
    return summaries


def by_length(
    edges: tuple[int, ...], drafting: dict[int, int], drafted: dict[int, int], accepted: dict[int, int]
) -> list[LengthAcceptance]:
    """Every bucket of ``edges`` with its counts (bin index to count, as the rollup bins hold them).

    >>> [(b.bucket, b.acceptance_rate) for b in by_length((32, 128), {0: 2}, {0: 10}, {0: 7})]
    [('0-32', 0.7), ('32-128', None), ('128+', None)]
    """
    out = []
    for index, label in enumerate(lengths.labels(edges)):
        low, high = lengths.bounds(edges, index)
        d, a = drafted.get(index, 0), accepted.get(index, 0)
        out.append(LengthAcceptance(label, low, high, drafting.get(index, 0), d, a, a / d if d else None))
    return out


def workload_summary(
    engine: Engine,
    workload: str,
    start: datetime,
    end: datetime,
    *,
    pair: Pair | None = None,
    mode: str | None = None,
) -> WorkloadSummary | None:
    """:func:`workload_summaries` for one workload; None when it has no records in the range."""
    found = workload_summaries(engine, start, end, workload=workload, pair=pair, mode=mode)
    return found[0] if found else None


def time_series(
    engine: Engine,
    workload: str,
    start: datetime,
    end: datetime,
    *,
    step: timedelta = timedelta(minutes=1),
    pair: Pair | None = None,
    mode: str | None = None,
) -> list[SeriesPoint]:
    """One point per ``step`` (a whole number of minutes) that has records, oldest first."""
    step_minutes = max(1, int(step.total_seconds() // 60))
    origin = minute_of(start)

    def point_of(bucket: datetime) -> datetime:
        offset = int((bucket - origin).total_seconds() // 60) // step_minutes * step_minutes
        return origin + timedelta(minutes=offset)

    sums: dict[datetime, Sums] = defaultdict(Sums)
    hist: dict[datetime, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    with engine.connect() as conn:
        for row in conn.execute(
            _sum_select(M.bucket).where(_filters(M, start, end, workload, pair, mode)).group_by(M.bucket)
        ):
            key = point_of(row[0])
            sums[key] = sums[key] + _to_sums(row[1:])
        for bucket, index, count in conn.execute(
            select(B.bucket, B.bin, func.sum(B.count))
            .where(_filters(B, start, end, workload, pair, mode), B.metric == bins.MS_PER_TOKEN)
            .group_by(B.bucket, B.bin)
        ):
            hist[point_of(bucket)][index] += int(count)
    return [
        SeriesPoint(
            bucket=key,
            requests=s.n_requests,
            acceptance_rate_tokens=s.acceptance_rate_tokens,
            acceptance_rate_requests=s.acceptance_rate_requests,
            mean_acceptance_length=s.mean_acceptance_length,
            ms_per_token_mean=s.ms_per_token_mean,
            ms_per_token_p95=bins.quantile(hist[key], 0.95),
            tokens_per_second=s.tokens_per_second,
        )
        for key, s in sorted(sums.items())
    ]


def _index_counts(
    engine: Engine, metric: str, workload: str, start: datetime, end: datetime, pair: Pair | None, mode: str | None
) -> tuple[dict[int, int], int]:
    with engine.connect() as conn:
        counts = {
            int(index): int(count)
            for index, count in conn.execute(
                select(B.bin, func.sum(B.count))
                .where(_filters(B, start, end, workload, pair, mode), B.metric == metric)
                .group_by(B.bin)
            )
        }
        steps = conn.execute(
            select(func.sum(M.sum_spec_steps)).where(_filters(M, start, end, workload, pair, mode))
        ).scalar()
    return counts, int(steps or 0)


def position_acceptance(
    engine: Engine,
    workload: str,
    start: datetime,
    end: datetime,
    *,
    pair: Pair | None = None,
    mode: str | None = "speculative",
) -> list[PositionAcceptance]:
    """Acceptance by draft position: accepted at position i over all verification steps (vLLM's definition)."""
    counts, steps = _index_counts(engine, bins.ACCEPTED_AT_POSITION, workload, start, end, pair, mode)
    if not counts:
        return []
    return [
        PositionAcceptance(i, counts.get(i, 0), steps, counts.get(i, 0) / steps if steps else None)
        for i in range(max(counts) + 1)
    ]


def acceptance_length_histogram(
    engine: Engine,
    workload: str,
    start: datetime,
    end: datetime,
    *,
    pair: Pair | None = None,
    mode: str | None = "speculative",
) -> list[LengthBin]:
    """How many verification steps accepted exactly j draft tokens, j = 0 .. max seen."""
    counts, _ = _index_counts(engine, bins.ACCEPTANCE_LENGTH, workload, start, end, pair, mode)
    if not counts:
        return []
    total = sum(counts.values())
    return [LengthBin(j, counts.get(j, 0), counts.get(j, 0) / total) for j in range(max(counts) + 1)]


def request_samples(
    engine: Engine,
    workload: str,
    start: datetime,
    end: datetime,
    *,
    pair: Pair | None = None,
    mode: str | None = None,
    limit: int | None = None,
) -> list[RequestSample]:
    """Per-request values in ``[start, end)`` (exact timestamps, from ``requests``), oldest first."""
    r = RequestRow
    query = select(
        r.request_id,
        r.ts_start,
        r.mode,
        r.num_draft_tokens,
        r.num_accepted_tokens,
        r.latency_ms,
        r.output_tokens,
        r.ttft_ms,
        r.decode_ms,
    ).where(r.workload == workload, r.ts_start >= start, r.ts_start < end)
    if pair is not None:
        query = query.where(r.target_model == pair.target_model, r.drafter == pair.drafter)
        query = query.where(r.draft_model.is_(None) if pair.draft_model is None else r.draft_model == pair.draft_model)
    if mode is not None:
        query = query.where(r.mode == mode)
    query = query.order_by(r.ts_start, r.id)
    if limit is not None:
        query = query.limit(limit)
    with engine.connect() as conn:
        return [
            RequestSample(
                request_id=rid,
                ts_start=ts,
                mode=m,
                acceptance_rate=accepted / drafted if drafted else None,
                ms_per_token=decode_ms_per_token(latency, ttft, output, decode),
                ttft_ms=ttft,
            )
            for rid, ts, m, drafted, accepted, latency, output, ttft, decode in conn.execute(query)
        ]


def workloads(engine: Engine, start: datetime, end: datetime) -> list[str]:
    """Workloads with records in the range."""
    with engine.connect() as conn:
        return list(
            conn.execute(
                select(M.workload).where(_filters(M, start, end, None, None, None)).distinct().order_by(M.workload)
            ).scalars()
        )


def pairs(engine: Engine, start: datetime, end: datetime, *, workload: str | None = None) -> list[Pair]:
    """Target/drafter pairs with records in the range."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(M.target_model, M.drafter, M.draft_model)
            .where(_filters(M, start, end, workload, None, None))
            .distinct()
        )
        return sorted(Pair(t, d, dm or None) for t, d, dm in rows)


def deployment_events(engine: Engine, start: datetime, end: datetime) -> list[DeploymentEvent]:
    """Model version events (first seen, version changed) in ``[start, end)``, oldest first."""
    e = DeploymentEventRow
    with engine.connect() as conn:
        rows = conn.execute(
            select(e.ts, e.kind, e.role, e.model, e.version, e.workload)
            .where(e.ts >= start, e.ts < end)
            .order_by(e.ts, e.id)
        )
        return [DeploymentEvent(*row) for row in rows]
