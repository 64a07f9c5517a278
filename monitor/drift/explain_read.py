"""The read behind the acceptance split: exact totals from the rollups, per-request samples for the intervals.

Each stratum is one window, workload and pair. Its accepted and drafted sums and its request count
come from ``rollup_minute`` (exact whatever the window's size, one grouped query); its per-request
figures are the drift run's hash sample (``sample_requests``, at most ``drift.sample_size``), which
the run hands over where it already read it for the same windows, so the split reads nothing twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from sqlalchemy import case, func, select
from sqlalchemy.engine import Connection

from monitor.drift.explain import Stratum
from monitor.drift.sampling import Sample, sample_requests
from monitor.drift.windows import Windows
from monitor.store.models import RollupMinuteRow
from monitor.store.reads.results import Pair
from monitor.store.rollups import minute_of

# A stratum's exact figures: speculative requests that drafted, accepted and drafted tokens.
Totals = dict[tuple[int, str, Pair], tuple[int, float, float]]
Samples = Mapping[tuple[str, Pair], tuple[Sample, Sample]]


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


def split_strata(conn: Connection, windows: Windows, sample_size: int, samples: Samples) -> list[Stratum]:
    """Every stratum with drafts in the windows; samples not in ``samples`` are read here."""
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
            drafting = sample.where((sample.mode == "speculative") & (sample.drafted > 0))
            strata.append(Stratum(k, workload, drafting.drafted, drafting.accepted, n, (accepted, drafted)))
    return strata
