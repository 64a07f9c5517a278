"""Which reference and current window each workload compares.

Default: rolling. The current window ends at ``now`` rounded up to the minute and lasts
``drift.current_window``; the reference window lasts ``drift.reference_window`` and ends where the
current one starts. Two things move a workload's windows:

* a pinned baseline (``draftwatch baseline pin``) replaces its reference window;
* a model version change (a ``version_changed`` deployment event for the pair's target or draft):
  while the change lies inside the current window, the current window starts at the change and the
  reference is the same length of time just before it, and results say "since draft version X → Y";
  once the change is older than the current window, the reference starts at the change (a reset:
  old-version traffic is no longer a baseline) and results say "baseline reset at ...".

>>> w = rolling_windows(datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC), timedelta(hours=1), timedelta(days=1))
>>> w.cur_start.isoformat(), w.cur_end.isoformat(), w.ref_start.isoformat()
('2026-03-01T11:01:00+00:00', '2026-03-01T12:01:00+00:00', '2026-02-28T11:01:00+00:00')
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import and_, or_, select
from sqlalchemy.engine import Connection

from monitor.drift.models import DriftBaselineRow
from monitor.store.models import DeploymentEventRow
from monitor.store.reads.results import Pair
from monitor.store.rollups import minute_after


@dataclass(frozen=True, slots=True)
class Windows:
    ref_start: datetime
    ref_end: datetime
    cur_start: datetime
    cur_end: datetime
    note: str | None = None


def rolling_windows(now: datetime, current: timedelta, reference: timedelta) -> Windows:
    """The default windows: current ends at ``now`` rounded up to a minute, reference just before."""
    end = minute_after(now)
    cur_start = end - current
    return Windows(cur_start - reference, cur_start, cur_start, end)


def pinned_baseline(conn: Connection, workload: str) -> tuple[datetime, datetime] | None:
    """The newest active pinned reference window of ``workload``, if any."""
    b = DriftBaselineRow
    row = conn.execute(
        select(b.ref_start, b.ref_end)
        .where(b.workload == workload, b.active.is_(True))
        .order_by(b.created_at.desc(), b.id.desc())
        .limit(1)
    ).first()
    return (row[0], row[1]) if row else None


def _version_label(conn: Connection, role: str, model: str, version: str, before: datetime) -> str:
    e = DeploymentEventRow
    previous = conn.execute(
        select(e.version)
        .where(e.role == role, e.model == model, e.ts < before, e.version != version)
        .order_by(e.ts.desc(), e.id.desc())
        .limit(1)
    ).scalar()
    return f"{role} version {previous or '?'} → {version}"


def workload_windows(
    conn: Connection, base: Windows, workload: str, pair: Pair, by_pair: dict[Pair, Windows] | None = None
) -> Windows:
    """``base`` adjusted for a pinned baseline and for version changes of the pair's models.

    The version changes are the pair's, whatever the workload: ``by_pair`` (one drift run's) keeps
    them, so that a run reads them once per pair rather than once per workload.
    """
    windows = by_pair.get(pair) if by_pair is not None else None
    if windows is None:
        windows = _version_windows(conn, base, pair)
        if by_pair is not None:
            by_pair[pair] = windows
    pinned = pinned_baseline(conn, workload)
    if pinned is not None:
        note = f"pinned baseline {pinned[0].isoformat()} .. {pinned[1].isoformat()}"
        windows = dataclasses.replace(
            windows, ref_start=pinned[0], ref_end=pinned[1], note=f"{windows.note}; {note}" if windows.note else note
        )
    return windows


def _version_windows(conn: Connection, base: Windows, pair: Pair) -> Windows:
    e = DeploymentEventRow
    draft_name = pair.draft_model or pair.drafter
    event = conn.execute(
        select(e.ts, e.role, e.model, e.version)
        .where(
            e.kind == "version_changed",
            e.ts > base.ref_start,
            e.ts < base.cur_end,
            or_(and_(e.role == "target", e.model == pair.target_model), and_(e.role == "draft", e.model == draft_name)),
        )
        .order_by(e.ts.desc(), e.id.desc())
        .limit(1)
    ).first()
    windows = base
    if event is not None:
        ts, role, model, version = event
        label = _version_label(conn, role, model, version, ts)
        if ts > base.cur_start:
            length = base.ref_end - base.ref_start
            windows = Windows(ts - length, ts, ts, base.cur_end, f"since {label}")
        else:
            windows = dataclasses.replace(base, ref_start=ts, note=f"baseline reset at {label}")
    return windows


def utc(ts: datetime) -> datetime:
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)
