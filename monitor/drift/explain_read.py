"""The read behind the acceptance split: exact totals from the rollups, per-request samples for the intervals.

Each stratum is one window, workload and pair. Its accepted and drafted sums and its request count
come from ``rollup_minute`` (exact whatever the window's size, one grouped query); its per-request
figures are the drift run's hash sample (``sample_requests``, at most ``drift.sample_size``), which
the run hands over where it already read it for the same windows, so the split reads nothing twice.
Level 2 reads, for a workload whose within part is named only, the factors of a sample of its
drafting requests (:func:`factor_requests`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Final

import numpy as np
from sqlalchemy import case, func, or_, select
from sqlalchemy.engine import Connection

from monitor.drift.explain import ACCEPTANCE, DECODE_SPEED, Metric, Stratum
from monitor.drift.explain_factors import SPEED_GROUPS, RequestFactors, Requests, label_requests
from monitor.drift.sampling import HASH_MODULUS, HASH_MULTIPLIER, Sample, decode_ms_per_token_of, sample_requests
from monitor.drift.stats import FloatArray
from monitor.drift.windows import Windows
from monitor.store.models import RequestRow, RollupMinuteRow
from monitor.store.reads.results import Pair
from monitor.store.rollups import minute_of

# A stratum's exact figures: speculative requests that drafted, accepted and drafted tokens.
Totals = dict[tuple[int, str, Pair], tuple[int, float, float]]
Samples = Mapping[tuple[str, Pair], tuple[Sample, Sample]]


# RequestRow's columns in RequestFactors' order.
_FACTOR_COLUMNS: Final = (
    "prompt_tokens",
    "output_tokens",
    "temperature",
    "top_p",
    "num_speculative_tokens",
    "style_hash",
    "prompt_copy_share",
    "drafter",
    "draft_model",
    "draft_version",
    "target_version",
    "replica",
    "cached_prompt_tokens",
    "engine_version",
    "replica_uptime_s",
    "kv_cache_use",
    "upstream_inflight",
    "num_accepted_tokens",
    "num_draft_tokens",
)


def drafting_totals(conn: Connection, ref_start: datetime, cur_start: datetime, cur_end: datetime) -> Totals:
    """Per window (0 reference, 1 current), workload and pair: the speculative rollup sums."""
    m = RollupMinuteRow
    is_cur = case((m.bucket >= minute_of(cur_start), 1), else_=0)
    rows = conn.execute(
        select(
            is_cur,
            m.workload,
            m.target_model,
            m.drafter,
            m.draft_model,
            func.sum(m.n_drafting),
            func.sum(m.sum_accepted_tokens),
            func.sum(m.sum_draft_tokens),
        )
        .where(m.bucket >= minute_of(ref_start), m.bucket < cur_end, m.mode == "speculative")
        .group_by(is_cur, m.workload, m.target_model, m.drafter, m.draft_model)
    )
    return {
        (int(flag), workload, Pair(target, drafter, draft_model or None)): (int(n or 0), float(a or 0), float(d or 0))
        for flag, workload, target, drafter, draft_model, n, a, d in rows
    }


def split_strata(
    conn: Connection, windows: Windows, sample_size: int, samples: Samples, metrics: Sequence[Metric]
) -> dict[Metric, list[Stratum]]:
    """Every stratum with drafts in the windows, for each of ``metrics``; samples not in ``samples`` are
    read here, once for all of them.

    Acceptance strata carry the rollups' exact sums; decode-speed strata are their samples alone.
    """
    totals = drafting_totals(conn, windows.ref_start, windows.cur_start, windows.cur_end)
    keys = sorted({(workload, pair) for _, workload, pair in totals})
    pairs_of: dict[str, set[Pair]] = {}
    for workload, pair in keys:
        pairs_of.setdefault(workload, set()).add(pair)
    strata: dict[Metric, list[Stratum]] = {metric: [] for metric in metrics}
    for workload, pair in keys:
        given = samples.get((workload, pair))
        bounds = ((windows.ref_start, windows.ref_end), (windows.cur_start, windows.cur_end))
        for k, (start, end) in enumerate(bounds):
            n, accepted, drafted = totals.get((k, workload, pair), (0, 0.0, 0.0))
            if n == 0:
                continue
            only_pair = len(pairs_of[workload]) == 1
            sample = given[k] if given is not None else None
            if sample is None:
                sample = sample_requests(conn, workload, pair, start, end, sample_size, only_pair=only_pair)
            for metric in metrics:
                exact = (n, (accepted, drafted)) if metric == ACCEPTANCE else (None, None)
                strata[metric].append(Stratum(k, workload, *ratio(sample, metric), *exact))
    return strata


def sample_strata(
    workload: str, samples: Sequence[tuple[Sample, Sample]], metric: Metric = ACCEPTANCE
) -> list[Stratum]:
    """The strata of one workload from its (reference, current) samples alone, one pair each.

    For windows of the workload's own (a pinned baseline, a version change), which the rollups'
    minute buckets cannot cut exactly: the samples stand for the windows.
    """
    strata = [Stratum(k, workload, *ratio(sample, metric)) for pair in samples for k, sample in enumerate(pair)]
    return [s for s in strata if len(s.drafted)]


def ratio(sample: Sample, metric: Metric) -> tuple[FloatArray, FloatArray]:
    """The requests of ``sample`` that ``metric`` counts, as (tokens, numerator): drafting requests' drafted
    and accepted tokens, or speculative requests' decode tokens (output − 1) and decode ms (NaN where unknown)."""
    if metric == DECODE_SPEED:
        spec = sample.where(sample.mode == "speculative")
        tokens = spec.output_tokens - 1
        return tokens, spec.decode_ms_per_token * tokens
    drafting = sample.where((sample.mode == "speculative") & (sample.drafted > 0))
    return drafting.drafted, drafting.accepted


def factor_requests(
    conn: Connection, workload: str, start: datetime, end: datetime, limit: int, metric: Metric = ACCEPTANCE
) -> Requests:
    """Up to ``limit`` requests of ``workload`` in ``[start, end)``, every pair, with their factors.

    Acceptance: drafting requests, drafted and accepted tokens. Decode speed: speculative requests
    with a decode time, decode tokens and ms (:func:`decoder.record.decode_ms_per_token`), labelled
    with the load and their acceptance too. The same fixed hash pick as
    :func:`monitor.drift.sampling.sample_requests`, so the same data always gives the same split;
    read only for a workload whose within part is named.
    """
    r = RequestRow
    hashed = ((r.id % HASH_MODULUS) * HASH_MULTIPLIER) % HASH_MODULUS
    speed = metric == DECODE_SPEED
    timed = or_(r.latency_ms.is_not(None), r.decode_ms.is_not(None))
    measured = (r.output_tokens >= 2, timed) if speed else (r.num_draft_tokens > 0,)
    kept = (
        r.workload == workload,
        r.ts_start >= start,
        r.ts_start < end,
        r.mode == "speculative",
        r.finish_reason != "error",
        *measured,
    )
    picked = select(r.id).where(*kept).order_by(hashed).limit(limit).scalar_subquery()
    timings = (r.latency_ms, r.ttft_ms, r.decode_ms)
    columns = (*timings, *(getattr(r, name) for name in _FACTOR_COLUMNS))
    rows = conn.execute(select(*columns).where(r.id.in_(picked), *kept).order_by(r.id)).all()
    factors = [RequestFactors(*row[3:]) for row in rows]
    if not speed:
        drafted = np.array([f.drafted for f in factors], dtype=float)
        accepted = np.array([f.accepted for f in factors], dtype=float)
        return label_requests(drafted, accepted, factors)
    latency, ttft, decode = (np.array([row[i] for row in rows], dtype=float) for i in range(3))  # None: NaN
    output = np.array([f.output_tokens for f in factors], dtype=float)
    ms = decode_ms_per_token_of(latency, ttft, output, decode) * (output - 1)
    return label_requests(output - 1, ms, factors, SPEED_GROUPS, bounded=False)
