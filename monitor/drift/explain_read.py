"""The read behind the acceptance split: exact totals from the rollups, per-request samples for the intervals.

Each stratum is one window, workload and pair. Its accepted and drafted sums and its request count
come from ``rollup_minute`` (exact whatever the window's size, one grouped query); its per-request
figures are the drift run's hash sample (``sample_requests``, at most ``drift.sample_size``), which
the run hands over where it already read it for the same windows, so the split reads nothing twice.
Level 2 reads, for a workload whose within part is named only, the factors of a sample of its
drafting requests (:func:`factor_requests`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Final

import numpy as np
from sqlalchemy import case, func, select
from sqlalchemy.engine import Connection

from decoder.record import decode_ms_per_token
from monitor.drift.explain import ACCEPTANCE, DECODE_SPEED, Metric, Stratum
from monitor.drift.explain_factors import SPEED_GROUPS, RequestFactors, Requests, label_requests
from monitor.drift.sampling import HASH_MODULUS, HASH_MULTIPLIER, Sample, sample_requests
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
    conn: Connection,
    windows: Windows,
    sample_size: int,
    samples: Samples,
    metric: Metric = ACCEPTANCE,
    totals: Totals | None = None,
) -> list[Stratum]:
    """Every stratum with drafts in the windows; samples not in ``samples`` are read here.

    Acceptance strata carry the rollups' exact sums; decode-speed strata are their samples alone.
    ``totals``: the windows' :func:`drafting_totals`, where the caller has read them for another split.
    """
    if totals is None:
        totals = drafting_totals(conn, windows.ref_start, windows.cur_start, windows.cur_end)
    keys = sorted({(workload, pair) for _, workload, pair in totals})
    pairs_of: dict[str, set[Pair]] = {}
    for workload, pair in keys:
        pairs_of.setdefault(workload, set()).add(pair)
    strata = []
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
            if metric == DECODE_SPEED:
                strata.append(_speed_stratum(k, workload, sample))
                continue
            drafting = _drafting(sample)
            strata.append(Stratum(k, workload, drafting.drafted, drafting.accepted, n, (accepted, drafted)))
    return strata


def sample_strata(
    workload: str, samples: Sequence[tuple[Sample, Sample]], metric: Metric = ACCEPTANCE
) -> list[Stratum]:
    """The strata of one workload from its (reference, current) samples alone, one pair each.

    For windows of the workload's own (a pinned baseline, a version change), which the rollups'
    minute buckets cannot cut exactly, and for decode speed, which the rollups do not sum per
    request: the samples stand for the windows.
    """
    strata = []
    for pair_samples in samples:
        for k, sample in enumerate(pair_samples):
            if metric == DECODE_SPEED:
                strata.append(_speed_stratum(k, workload, sample))
            else:
                drafting = _drafting(sample)
                strata.append(Stratum(k, workload, drafting.drafted, drafting.accepted))
    return [s for s in strata if len(s.drafted)]


def _speed_stratum(window: int, workload: str, sample: Sample) -> Stratum:
    """Decode tokens (output − 1) and decode ms of the sample's speculative requests (NaN where unknown)."""
    spec = sample.where(sample.mode == "speculative")
    tokens = spec.output_tokens - 1
    return Stratum(window, workload, tokens, spec.decode_ms_per_token * tokens)


def _drafting(sample: Sample) -> Sample:
    return sample.where((sample.mode == "speculative") & (sample.drafted > 0))


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
    measured = (r.output_tokens >= 2, r.latency_ms.is_not(None)) if speed else (r.num_draft_tokens > 0,)
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
    tokens = np.array([f.output_tokens - 1 for f in factors], dtype=float)
    per_token = [
        decode_ms_per_token(row[0], row[1], f.output_tokens, row[2]) for row, f in zip(rows, factors, strict=True)
    ]
    ms = np.array([math.nan if v is None else v for v in per_token], dtype=float) * tokens
    return label_requests(tokens, ms, factors, SPEED_GROUPS, bounded=False)
