"""Online detectors between scheduled runs: Page–Hinkley per workload and pair, state in the database.

Each run feeds every detector the speculative requests that arrived since the last one it saw
(at most ``cap``, the newest), stores the new state and watermark, and reports a result. A detector
that fired is reported once and then reset, so that it learns the new level instead of firing on
every later run. A detector with no state starts at the current window (history is the batch
tests' job).
"""

from __future__ import annotations

import logging
from datetime import datetime

import numpy as np
from sqlalchemy import and_, insert, or_, select, update
from sqlalchemy.engine import Connection

from monitor.drift.detectors.page_hinkley import PageHinkley
from monitor.drift.models import DetectorStateRow
from monitor.drift.result import Decision, DriftResult
from monitor.store.models import RequestRow
from monitor.store.reads.results import Pair

log = logging.getLogger(__name__)
DETECTOR = "page_hinkley"


def _new_rates(
    conn: Connection, workload: str, pair: Pair, after: tuple[datetime, int], end: datetime, cap: int
) -> tuple[list[float], tuple[datetime, int] | None]:
    r = RequestRow
    ts, last_id = after
    rows = conn.execute(
        select(r.ts_start, r.id, r.num_accepted_tokens, r.num_draft_tokens)
        .where(
            r.workload == workload,
            r.target_model == pair.target_model,
            r.drafter == pair.drafter,
            r.draft_model.is_(None) if pair.draft_model is None else r.draft_model == pair.draft_model,
            r.mode == "speculative",
            r.num_draft_tokens > 0,
            or_(r.ts_start > ts, and_(r.ts_start == ts, r.id > last_id)),
            r.ts_start < end,
        )
        .order_by(r.ts_start.desc(), r.id.desc())
        .limit(cap)
    ).all()
    if not rows:
        return [], None
    rows = list(reversed(rows))
    return [acc / drafted for _ts, _id, acc, drafted in rows], (rows[-1][0], rows[-1][1])


def update_detector(
    conn: Connection, workload: str, pair: Pair, start: datetime, end: datetime, now: datetime, cap: int
) -> DriftResult:
    """Feed the new requests of one workload and pair, persist the state, report the detector."""
    label = pair.label
    d = DetectorStateRow
    key = (d.detector == DETECTOR, d.workload == workload, d.pair == label)
    row = conn.execute(select(d.id, d.state, d.last_ts, d.last_id).where(*key)).first()
    detector = PageHinkley.from_state(row.state) if row else PageHinkley()
    after = (row.last_ts, row.last_id or 0) if row and row.last_ts else (start, 0)
    n_before, mean_before = detector.n, detector.mean
    rates, watermark = _new_rates(conn, workload, pair, after, end, cap)
    detector.update_many(rates)
    decision: Decision = "no_drift"
    if detector.drift_detected:
        decision = "drift"
    elif detector.n < detector.min_instances:
        decision = "insufficient_data"
    result = DriftResult(
        test=DETECTOR,
        metric="acceptance_rate",
        n_ref=n_before,
        n_cur=len(rates),
        statistic=detector.statistic,
        p=None,
        effect=float(np.mean(rates)) - mean_before if rates and n_before else None,
        ci=None,
        decision=decision,
        passes_floor=detector.drift_detected,
        note=f"Page–Hinkley fired ({detector.direction})" if detector.drift_detected else None,
        detail={"threshold": detector.threshold, "delta": detector.delta, "seen": detector.n},
    )
    if detector.drift_detected:
        log.info("page_hinkley fired for %s %s (%s); resetting", workload, label, detector.direction)
        detector.reset()
    last_ts, last_id = watermark if watermark else after
    values = {"state": detector.state(), "last_ts": last_ts, "last_id": last_id, "updated_at": now}
    if row:
        conn.execute(update(d).where(d.id == row.id).values(**values))
    else:
        conn.execute(insert(d).values(detector=DETECTOR, workload=workload, pair=label, **values))
    return result
