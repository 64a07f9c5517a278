"""Read-only queries the dashboard needs beyond :mod:`monitor.store.reads.queries`.

Like those, aggregates come from the per-minute rollups, so a page costs the same over a thousand
records as over millions; the few per-request reads (current γ and mode, the cost ratios for the
what-if chart) take the newest rows of one workload through the ``(workload, ts_start)`` index and
are capped.

>>> from datetime import UTC, datetime
>>> from monitor.store.engine import create_engine
>>> from monitor.store.migrate import upgrade
>>> engine = create_engine("sqlite://")
>>> _ = upgrade(engine)
>>> t = datetime(2026, 1, 1, tzinfo=UTC)
>>> has_records(engine), current_settings(engine, t, t), pair_summaries(engine, t, t)
(False, {}, [])
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import and_, func, select
from sqlalchemy.engine import Engine

from decoder.speculation.controller import expected_speedup
from monitor.store import bins
from monitor.store.models import RequestRow, RollupBinRow, RollupMinuteRow
from monitor.store.reads.results import Pair, Sums
from monitor.store.rollups import SUM_COLUMNS, minute_of

M = RollupMinuteRow
B = RollupBinRow
R = RequestRow

# Requests read per workload to estimate the cost ratios of the what-if chart: enough for a
# stable mean, few enough that the read stays in the milliseconds on a large table.
COST_SAMPLE: Final = 2000


@dataclass(frozen=True, slots=True)
class CurrentSetting:
    """What the newest request of a workload ran with: the controller's latest choice."""

    workload: str
    ts: datetime
    mode: str
    gamma: int


@dataclass(frozen=True, slots=True)
class LatencyPoint:
    """Latency percentiles of one time step, from the fixed-bucket histograms."""

    bucket: datetime
    requests: int
    ms_per_token_p50: float | None
    ms_per_token_p95: float | None
    ms_per_token_p99: float | None
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None


@dataclass(frozen=True, slots=True)
class PairSummary:
    """One workload, one target/drafter pair, one mode over a time range."""

    workload: str
    pair: Pair
    mode: str
    sums: Sums
    ms_per_token_p95: float | None


@dataclass(frozen=True, slots=True)
class SpeedupInputs:
    """The inputs of :func:`decoder.speculation.controller.expected_speedup`, measured over recent requests.

    ``alpha`` is accepted drafts over drafts the target judged (a step stops judging at its first
    rejection); ``c`` is draft ms per drafted token over ``t1``, the ms of a one-token target pass;
    ``b_over_t1`` the extra target time per verified draft. ``t1`` comes from plain or holdout
    requests when there are any (``t1_source`` ``"holdout"``), else from the verification passes with
    ``b_over_t1`` taken as 0, which makes the estimate optimistic (``t1_source`` ``"verify"``).
    """

    requests: int
    alpha: float
    c: float
    b_over_t1: float
    gamma: int
    t1_source: str

    def speedup(self, gamma: int | None = None) -> float:
        return expected_speedup(self.alpha, self.c, self.b_over_t1, self.gamma if gamma is None else gamma)


def has_records(engine: Engine) -> bool:
    """Whether the store holds any request at all (an empty range and an empty store differ)."""
    with engine.connect() as conn:
        return conn.execute(select(M.id).limit(1)).first() is not None


def current_settings(
    engine: Engine, start: datetime, end: datetime, *, workloads: list[str] | None = None
) -> dict[str, CurrentSetting]:
    """Mode and γ of each workload's newest non-holdout request in ``[start, end)``."""
    with engine.connect() as conn:
        names = workloads
        if names is None:
            names = list(
                conn.execute(
                    select(M.workload).where(M.bucket >= minute_of(start), M.bucket < end).distinct()
                ).scalars()
            )
        found: dict[str, CurrentSetting] = {}
        for name in sorted(names):
            # One indexed probe per workload: holdout is control traffic, not the controller's choice.
            row = conn.execute(
                select(R.ts_start, R.mode, R.num_speculative_tokens)
                .where(R.workload == name, R.ts_start >= start, R.ts_start < end, R.mode != "holdout")
                .order_by(R.ts_start.desc())
                .limit(1)
            ).first()
            if row is not None:
                found[name] = CurrentSetting(name, row[0], row[1], int(row[2]))
    return found


def _step_origin(start: datetime, step: timedelta) -> tuple[datetime, int]:
    return minute_of(start), max(1, int(step.total_seconds() // 60))


def latency_series(
    engine: Engine,
    workload: str,
    start: datetime,
    end: datetime,
    *,
    step: timedelta = timedelta(minutes=1),
    mode: str | None = None,
) -> list[LatencyPoint]:
    """p50/p95/p99 ms per output token and p50/p95 TTFT per ``step``, oldest first (steps with data only)."""
    origin, step_minutes = _step_origin(start, step)

    def point_of(bucket: datetime) -> datetime:
        offset = int((bucket - origin).total_seconds() // 60) // step_minutes * step_minutes
        return origin + timedelta(minutes=offset)

    where = [B.workload == workload, B.bucket >= origin, B.bucket < end]
    if mode is not None:
        where.append(B.mode == mode)
    hist: dict[tuple[datetime, str], dict[int, int]] = defaultdict(lambda: defaultdict(int))
    with engine.connect() as conn:
        for bucket, metric, index, count in conn.execute(
            select(B.bucket, B.metric, B.bin, func.sum(B.count))
            .where(and_(*where), B.metric.in_([bins.MS_PER_TOKEN, bins.TTFT_MS]))
            .group_by(B.bucket, B.metric, B.bin)
        ):
            hist[(point_of(bucket), metric)][int(index)] += int(count)
    points = sorted({key for key, _ in hist})
    return [
        LatencyPoint(
            bucket=p,
            requests=sum(hist[(p, bins.MS_PER_TOKEN)].values()),
            ms_per_token_p50=bins.quantile(hist[(p, bins.MS_PER_TOKEN)], 0.50),
            ms_per_token_p95=bins.quantile(hist[(p, bins.MS_PER_TOKEN)], 0.95),
            ms_per_token_p99=bins.quantile(hist[(p, bins.MS_PER_TOKEN)], 0.99),
            ttft_p50_ms=bins.quantile(hist[(p, bins.TTFT_MS)], 0.50),
            ttft_p95_ms=bins.quantile(hist[(p, bins.TTFT_MS)], 0.95),
        )
        for p in points
    ]


def _sums(values: Any) -> Sums:
    # PostgreSQL's SUM(bigint) is NUMERIC: bring every figure back to the type Sums declares.
    floats = {name for name, spec in Sums.__dataclass_fields__.items() if spec.type == "float"}
    figures: dict[str, Any] = {
        c: (float(v or 0) if c in floats else int(v or 0)) for c, v in zip(SUM_COLUMNS, values, strict=True)
    }
    return Sums(**figures)


def pair_summaries(engine: Engine, start: datetime, end: datetime, *, workload: str | None = None) -> list[PairSummary]:
    """Sums and p95 ms per token per workload, pair and mode over ``[start, end)``, sorted."""
    key = (M.workload, M.target_model, M.drafter, M.draft_model, M.mode)
    where = [M.bucket >= minute_of(start), M.bucket < end]
    bin_where = [B.bucket >= minute_of(start), B.bucket < end, B.metric == bins.MS_PER_TOKEN]
    if workload is not None:
        where.append(M.workload == workload)
        bin_where.append(B.workload == workload)
    hist: dict[tuple[Any, ...], dict[int, int]] = defaultdict(lambda: defaultdict(int))
    with engine.connect() as conn:
        rows = conn.execute(
            select(*key, *[func.sum(getattr(M, c)) for c in SUM_COLUMNS]).where(and_(*where)).group_by(*key)
        ).all()
        bin_key = (B.workload, B.target_model, B.drafter, B.draft_model, B.mode)
        for *k, index, count in conn.execute(
            select(*bin_key, B.bin, func.sum(B.count)).where(and_(*bin_where)).group_by(*bin_key, B.bin)
        ):
            hist[tuple(k)][int(index)] += int(count)
    out = [
        PairSummary(
            workload=row[0],
            pair=Pair(row[1], row[2], row[3] or None),
            mode=row[4],
            sums=_sums(row[5:]),
            ms_per_token_p95=bins.quantile(hist[tuple(row[:5])], 0.95),
        )
        for row in rows
    ]
    return sorted(out, key=lambda s: (s.workload, s.pair, s.mode))


def speedup_inputs(
    engine: Engine,
    workload: str,
    start: datetime,
    end: datetime,
    *,
    pair: Pair | None = None,
    limit: int = COST_SAMPLE,
) -> SpeedupInputs | None:
    """α, c and b/t1 of ``workload`` from its newest ``limit`` speculative requests in the range.

    ``pair`` restricts the speculative requests (plain and holdout ones of the same target count as
    the baseline whatever their drafter). None when no speculative request drafted anything.
    """
    spec_where = [R.workload == workload, R.ts_start >= start, R.ts_start < end, R.mode == "speculative"]
    plain_where = [R.workload == workload, R.ts_start >= start, R.ts_start < end, R.mode.in_(["plain", "holdout"]),
                   R.mode_inferred.is_(False)]  # fmt: skip
    if pair is not None:
        spec_where += [R.target_model == pair.target_model, R.drafter == pair.drafter]
        spec_where.append(R.draft_model.is_(None) if pair.draft_model is None else R.draft_model == pair.draft_model)
        plain_where.append(R.target_model == pair.target_model)
    with engine.connect() as conn:
        spec = conn.execute(
            select(
                R.num_spec_steps,
                R.num_draft_tokens,
                R.num_accepted_tokens,
                R.acceptance_histogram,
                R.draft_ms,
                R.verify_ms,
                R.num_speculative_tokens,
            )
            .where(*spec_where)
            .order_by(R.ts_start.desc())
            .limit(limit)
        ).all()
        plain = conn.execute(
            select(R.output_tokens, R.latency_ms, R.ttft_ms)
            .where(*plain_where)
            .order_by(R.ts_start.desc())
            .limit(limit)
        ).all()
    steps = drafted = accepted = judged = 0
    draft_ms = verify_ms = 0.0
    gammas: list[int] = []
    n = 0
    for s, d, a, hist, dms, vms, g in spec:
        if not d or dms is None or vms is None:
            continue
        n += 1
        steps, drafted, accepted = steps + s, drafted + d, accepted + a
        draft_ms, verify_ms = draft_ms + dms, verify_ms + vms
        gammas.append(int(g))
        width = len(hist) - 1  # the histogram has gamma + 1 entries
        # A step that accepted j < gamma drafts judged j + 1 of them; a full step judged all gamma.
        judged += sum(count * min(width, j + 1) for j, count in enumerate(hist))
    if n == 0 or steps == 0 or drafted == 0:
        return None
    alpha = min(1.0, accepted / judged) if judged else 0.0
    gamma = sorted(gammas)[len(gammas) // 2]
    passes = sum(int(o) - 1 for o, lat, _ in plain if lat is not None and o and o > 1)
    plain_ms = sum(float(lat) - float(t or 0.0) for o, lat, t in plain if lat is not None and o and o > 1)
    per_step = verify_ms / steps
    if passes > 0 and plain_ms > 0:
        t1, source = plain_ms / passes, "holdout"
        b_over_t1 = max(0.0, (per_step - t1) / (drafted / steps) / t1)
    else:
        t1, source, b_over_t1 = per_step, "verify", 0.0
    c = (draft_ms / drafted) / t1 if t1 > 0 else 0.0
    if not all(math.isfinite(x) for x in (alpha, c, b_over_t1)):
        return None
    return SpeedupInputs(n, alpha, c, b_over_t1, gamma, source)
