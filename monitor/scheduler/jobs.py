"""The scheduled jobs and their history: each run of a job is claimed per tick, fenced, recorded.

A tick is the job's scheduled time on a grid shared by every replica (multiples of its interval
since the start of its grid, :func:`grid_starts`: the Unix epoch, for retention half a drift interval
later). :func:`run_tick` first inserts ``job_runs(job, tick)`` (unique) in a fenced
transaction: a tick is claimed once, so after a takeover the new leader never repeats a tick the
old one started. A failed job is recorded and simply runs again on its next tick; repeated failures
raise the ``scheduler`` alert (:mod:`monitor.scheduler.health`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from sqlalchemy import insert, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from monitor.alerts.evaluate import evaluate_alerts
from monitor.config import Settings
from monitor.drift.detectors.ledger import read_ledger
from monitor.drift.detectors.ledger_rates import LEDGER_WINDOW, ledger_rates, store_ledger_rates
from monitor.drift.run import run_drift
from monitor.drift.verdict import verdict_of
from monitor.ingest.scrape.run import scrape_due
from monitor.notify.delivery import deliver_pending
from monitor.proxy.decide import decide_routes, measured_curves
from monitor.proxy.rollout import advance_rollouts
from monitor.scheduler.health import evaluate_health
from monitor.scheduler.lease import Lease, LeaseLostError
from monitor.scheduler.models import JobRunRow
from monitor.scheduler.retention import apply_retention
from monitor.store.partitions import PartitionLockError, ensure_all_partitions
from monitor.store.types import Fence

log = logging.getLogger(__name__)

Job = Callable[[Engine, Settings, datetime, Fence], Mapping[str, Any]]
GRID_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Never run at once (in the leader's process): the drift run reads requests for seconds (3-4 s at 10M rows),
# and each of retention's partition drops waits for every read of the table to end.
SERIAL_JOBS: Final = frozenset({"drift", "retention"})


def tick_of(now: datetime, interval: timedelta, start: datetime = GRID_EPOCH) -> datetime:
    """The point at or before ``now`` of the grid of ``interval`` from ``start``.

    >>> tick_of(datetime(2026, 1, 1, 12, 7, 31, tzinfo=UTC), timedelta(minutes=5)).isoformat()
    '2026-01-01T12:05:00+00:00'
    >>> tick_of(datetime(2026, 1, 1, 0, 1, tzinfo=UTC), timedelta(days=1), GRID_EPOCH + timedelta(minutes=2))
    datetime.datetime(2025, 12, 31, 0, 2, tzinfo=datetime.timezone.utc)
    """
    step = interval.total_seconds()
    return start + timedelta(seconds=((now - start).total_seconds() // step) * step)


def drift_job(engine: Engine, settings: Settings, tick: datetime, fence: Fence) -> Mapping[str, Any]:
    """One drift run ending at now, stored only while the lease holds, then the alert rules over it."""
    run = run_drift(engine, settings.drift, fence=fence)
    evaluation = evaluate_alerts(engine, settings.alert_config, run.results, fence=fence)
    verdicts = [verdict_of(r) for r in run.results if r.test == "net_loss"]
    now = datetime.now(UTC)
    routing = settings.proxy.on_net_loss == "route" and settings.proxy.has_baseline
    # The load curves over the longest window a drift run widens to: a curve needs several levels' worth a side.
    curves = measured_curves(engine, settings.drift, now - settings.drift.max_current_window, now) if routing else {}
    switches = decide_routes(engine, settings.proxy, verdicts, now, curves)
    # Once here for every sidecar, which values its recorded tokens at these rates
    # (monitor/drift/detectors/ledger_rates.py).
    rates = ledger_rates(read_ledger(engine, settings.drift, now - LEDGER_WINDOW, now))
    with engine.begin() as conn:
        fence(conn)
        store_ledger_rates(conn, run.run_id, rates)
    return {"run_id": run.run_id, "results": len(run.results), "drift": len(run.drifts), "routing_switches":
            len(switches), **_eval(evaluation)}  # fmt: skip


def delivery_job(engine: Engine, settings: Settings, tick: datetime, fence: Fence) -> Mapping[str, Any]:
    # Not fenced: delivery is at least once by design and claims rows itself.
    report = deliver_pending(engine, settings.delivery)
    return {"attempted": report.attempted, "delivered": report.delivered, "retried": report.retried,
            "dead": report.dead}  # fmt: skip


def health_job(engine: Engine, settings: Settings, tick: datetime, fence: Fence) -> Mapping[str, Any]:
    return _eval(evaluate_health(engine, settings, fence=fence))


def retention_job(engine: Engine, settings: Settings, tick: datetime, fence: Fence) -> Mapping[str, Any]:
    """The partitions of requests and rollups made ahead (PostgreSQL), then retention (which drops the expired ones)."""
    now = datetime.now(UTC)
    # Ahead at least past this job's next run, so that records never wait in the default partition for it.
    interval_days = math.ceil(settings.scheduler.retention_interval / timedelta(days=1))
    ahead = max(settings.database.partitions_ahead_days, interval_days + 1)
    failed: PartitionLockError | None = None
    try:
        created = ensure_all_partitions(engine, now, ahead, partition_days=settings.database.partition_days,
                                        wait_s=settings.retention.partition_lock_wait_s)  # fmt: skip
    except PartitionLockError as error:  # retention still runs; the job is reported failed below
        created, failed = [], error
    detail = {**apply_retention(engine, settings.retention, now, fence), "partitions_created": len(created)}
    if failed is not None:
        raise failed
    return detail


def scrape_job(engine: Engine, settings: Settings, tick: datetime, fence: Fence) -> Mapping[str, Any]:
    report = scrape_due(engine, settings.scrape.targets, fence=fence)
    return {"scraped": report.scraped, "intervals": report.intervals, "failed": sorted(report.failed)}


def rollout_job(engine: Engine, settings: Settings, tick: datetime, fence: Fence) -> Mapping[str, Any]:
    events = advance_rollouts(engine, settings.rollout, datetime.now(UTC), sample_size=settings.drift.sample_size,
                              fence=fence)  # fmt: skip
    return {"events": [f"{e.rollout_id}:{e.kind}" for e in events]}


def _eval(evaluation: Any) -> dict[str, Any]:
    return {"transitions": len(evaluation.transitions), "notified": len(evaluation.notified),
            "outbox": evaluation.outbox_rows}  # fmt: skip


JOBS: dict[str, Job] = {
    "drift": drift_job,
    "delivery": delivery_job,
    "health": health_job,
    "retention": retention_job,
    "scrape": scrape_job,
    "rollout": rollout_job,
}


def intervals(settings: Settings) -> dict[str, timedelta]:
    return {
        "drift": settings.scheduler.drift_interval,
        "delivery": settings.scheduler.delivery_interval,
        "health": settings.scheduler.health_interval,
        "retention": settings.scheduler.retention_interval,
        "scrape": settings.scheduler.scrape_interval,
        "rollout": settings.scheduler.rollout_interval,
    }


def grid_starts(settings: Settings) -> dict[str, datetime]:
    """Where each job's grid starts: the Unix epoch, retention's half a drift interval later.

    On one grid the daily retention tick would also be a drift tick, and its partition drops would
    wait behind the drift run's reads. Half a drift interval apart, the two never meet while the
    retention interval is a multiple of the drift interval (the defaults: 1 day and 5 minutes);
    otherwise :data:`SERIAL_JOBS` keeps them apart.
    """
    starts = dict.fromkeys(intervals(settings), GRID_EPOCH)
    starts["retention"] = GRID_EPOCH + settings.scheduler.drift_interval / 2
    return starts


def run_tick(engine: Engine, settings: Settings, lease: Lease, job: str, tick: datetime, fn: Job) -> str:
    """Claim ``(job, tick)`` and run it; returns ok, failed, fenced or skipped (already claimed / not leader)."""
    started, t0 = datetime.now(UTC), time.perf_counter()
    try:
        with engine.begin() as conn:
            run_id = conn.execute(
                insert(JobRunRow)
                .values(job=job, tick=tick, holder=lease.holder, epoch=lease.epoch or 0, status="running",
                        started_at=started, detail={})
                .returning(JobRunRow.id)
            ).scalar_one()  # fmt: skip
            lease.fence(conn)
    except IntegrityError:
        log.debug("job %s tick %s already claimed", job, tick.isoformat())
        return "skipped"
    except LeaseLostError:
        return "skipped"
    status, error, detail = "ok", None, {}
    try:
        detail = dict(fn(engine, settings, tick, lease.fence))
    except LeaseLostError as lost:
        status, error = "fenced", str(lost)
        log.warning("job %s tick %s: results discarded, %s", job, tick.isoformat(), lost)
    except Exception as failure:  # recorded and retried on the next tick; the traceback goes to the log
        status, error = "failed", f"{type(failure).__name__}: {str(failure).splitlines()[0] if str(failure) else ''}"
        log.exception("job %s tick %s failed", job, tick.isoformat())
    finished = datetime.now(UTC)
    with engine.begin() as conn:
        conn.execute(
            update(JobRunRow)
            .where(JobRunRow.id == run_id)
            .values(status=status, finished_at=finished, duration_s=time.perf_counter() - t0, error=error,
                    detail=detail)
        )  # fmt: skip
    return status


def abandon_stale_runs(engine: Engine, holder: str) -> int:
    """Mark runs another holder left ``running`` (it died or lost the lease) as abandoned; on takeover."""
    with engine.begin() as conn:
        result = conn.execute(
            update(JobRunRow)
            .where(JobRunRow.status == "running", JobRunRow.holder != holder)
            .values(status="abandoned", finished_at=datetime.now(UTC), error="the replica running it lost the lease")
        )
    return int(result.rowcount or 0)
