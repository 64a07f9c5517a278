"""Health signals for the ``health`` rules: scheduler jobs, drift staleness, recorder spool, dead letters.

* ``job_failures`` (label ``job``): the last ``scheduler.failure_alert_after`` finished runs of a
  job all failed; a failing job is simply retried on its next tick meanwhile.
* ``drift_stale`` (label ``job=drift``): the last successful drift run is older than three drift
  intervals (the scheduler stopped doing its main job).
* ``recorder_spool`` (label ``host``): spool segments older than a minute lie in this host's spool
  directory, i.e. a recorder here could not write to the database for a while.
* ``dead_letters``: a notification became a dead letter in the last day.
* ``scrape_target`` (label ``target``): a ``[[scrape]]`` target failed its last
  ``SCRAPE_FAILURES`` scrapes (down, or a body that is not its engine's exposition).
"""

from __future__ import annotations

import socket
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from monitor.alerts.evaluate import Evaluation, Signal, evaluate_signals, stale_cutoff
from monitor.config import Settings
from monitor.ingest.spool import PREFIX, SUFFIX
from monitor.notify.models import NotificationRow
from monitor.scheduler.models import JobRunRow
from monitor.store.routing import latest_routing
from monitor.store.scrape import target_health
from monitor.store.types import Fence

SPOOL_AGE_S: Final = 60.0
# One failed scrape is a blip (a restart, a slow response); three in a row are an outage.
SCRAPE_FAILURES: Final = 3
DEAD_LETTER_WINDOW: Final = timedelta(days=1)


def _age(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:  # replayed and removed meanwhile
        return 0.0


def _decision(active: bool) -> str:
    return "drift" if active else "no_drift"


def health_signals(engine: Engine, settings: Settings, now: datetime) -> list[Signal]:
    """The current health signals (see the module docstring)."""
    signals: list[Signal] = []
    j = JobRunRow
    with engine.connect() as conn:
        for (job,) in conn.execute(select(j.job).distinct()).all():
            statuses = conn.execute(
                select(j.status)
                .where(j.job == job, j.status.in_(("ok", "failed")))
                .order_by(j.started_at.desc())
                .limit(settings.scheduler.failure_alert_after)
            ).scalars().all()  # fmt: skip
            if len(statuses) == settings.scheduler.failure_alert_after:
                active = all(s == "failed" for s in statuses)
                signals.append(Signal("health", "job_failures", _decision(active), {"job": job}))
        last_ok = conn.execute(select(func.max(j.finished_at)).where(j.job == "drift", j.status == "ok")).scalar()
        if last_ok is not None:
            stale = last_ok < stale_cutoff(now, settings.scheduler.drift_interval)
            signals.append(Signal("health", "drift_stale", _decision(stale), {"job": "drift"}))
        n = NotificationRow
        dead = conn.execute(
            select(func.count()).where(n.status == "dead", n.created_at >= now - DEAD_LETTER_WINDOW)
        ).scalar_one()
    signals.append(Signal("health", "dead_letters", _decision(dead > 0), {}, float(dead)))
    for workload, route in sorted(latest_routing(engine).items()):
        # Active while a workload is routed to plain: the alert fires on the switch and resolves on the way back.
        signals.append(Signal("health", "routing", _decision(route.routed), {"workload": workload}, route.speedup,
                              route.reason))  # fmt: skip
    for target in target_health(engine):
        failing = target.failures >= SCRAPE_FAILURES
        note = f"{target.status}: {target.error}" if failing else None
        signals.append(Signal("health", "scrape_target", _decision(failing), {"target": target.name}, None, note))
    spool = settings.recorder.spool_dir
    old = [p for p in spool.glob(f"{PREFIX}*{SUFFIX}") if _age(p) > SPOOL_AGE_S]
    host = socket.gethostname()
    signals.append(Signal("health", "recorder_spool", _decision(bool(old)), {"host": host}, float(len(old))))
    return signals


def evaluate_health(
    engine: Engine, settings: Settings, *, now: datetime | None = None, fence: Fence | None = None
) -> Evaluation:
    """Evaluate the health rules now (the scheduler's ``health`` job)."""
    now = now or datetime.now(UTC)
    return evaluate_signals(
        engine, settings.alert_config, "health", health_signals(engine, settings, now), now=now, fence=fence
    )
