"""The scheduler service: an APScheduler 3.x BackgroundScheduler plus the lease heartbeat.

Every replica runs the same jobs on the same grid (interval triggers anchored at the Unix epoch,
retention's half a drift interval later: :func:`monitor.scheduler.jobs.grid_starts`); a job body
returns at once unless this replica holds the lease, and then claims its tick
(:func:`monitor.scheduler.jobs.run_tick`). The jobs of :data:`~monitor.scheduler.jobs.SERIAL_JOBS`
(drift and retention) wait for one another. On PostgreSQL every statement of a job is bounded by
``scheduler.statement_timeout_s`` when the service opens its own connections. The heartbeat is a
plain thread, not a job, so a long job in APScheduler's pool never delays the renewal that keeps
this replica the leader.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger
from sqlalchemy.engine import Engine

from monitor.config import Settings
from monitor.scheduler.jobs import JOBS, SERIAL_JOBS, abandon_stale_runs, grid_starts, intervals, run_tick, tick_of
from monitor.scheduler.lease import Lease
from monitor.store.engine import create_engine, normalize_url
from monitor.store.migrate import current_revision, head_revision

log = logging.getLogger(__name__)


class SchedulerService:
    """Start with :meth:`start`, stop with :meth:`stop`; ``jobs`` limits which jobs run (default: all)."""

    def __init__(self, settings: Settings, engine: Engine | None = None, jobs: Iterable[str] | None = None) -> None:
        self.settings = settings
        self._own_engine = engine is None
        self.engine = engine or _engine(settings)
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease = Lease(self.engine, self.holder, settings.scheduler.lease_ttl_s)
        # Scrape mode's job runs only where targets are configured: elsewhere it would fill the job history.
        # The rollout's runs everywhere: the elected scheduler may have no candidate pool of its own, and
        # a rollout that no one judged would wait at its step for ever.
        default = [name for name in JOBS if name != "scrape" or settings.scrape.targets]
        self.jobs = list(jobs) if jobs is not None else default
        unknown = set(self.jobs) - set(JOBS)
        if unknown:
            raise ValueError(f"unknown job(s): {', '.join(sorted(unknown))}")
        self._serial = threading.Lock()
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._schema_ready = False
        self._waiting_said = False
        self._head = head_revision()
        self._scheduler = BackgroundScheduler(
            timezone=UTC,
            job_defaults={
                "coalesce": settings.scheduler.coalesce,
                "max_instances": settings.scheduler.max_instances,
                "misfire_grace_time": max(1, int(settings.scheduler.misfire_grace_s)),
            },
        )

    def start(self) -> SchedulerService:
        every, starts = intervals(self.settings), grid_starts(self.settings)
        for name in self.jobs:
            trigger = IntervalTrigger(seconds=every[name].total_seconds(), start_date=starts[name], timezone=UTC)
            self._scheduler.add_job(self._run, trigger, args=[name], id=name, name=name)
        self._beat()  # try to lead at once, before the first tick
        self._heartbeat = threading.Thread(target=self._heartbeat_loop, name="draftwatch-lease", daemon=True)
        self._heartbeat.start()
        self._scheduler.start()
        log.info("scheduler %s started (jobs: %s)", self.holder, ", ".join(self.jobs))
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._scheduler.running:
            self._scheduler.shutdown(wait=True)
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=10)
        try:
            self.lease.release()
        except Exception as error:  # the lease simply expires if the database is gone
            log.warning("could not release the scheduler lease: %s", type(error).__name__)
        if self._own_engine:
            self.engine.dispose()
        log.info("scheduler %s stopped", self.holder)

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.settings.scheduler.heartbeat_s):
            self._beat()

    def _beat(self) -> None:
        if not self._schema_ready and not self._schema_at_head():
            return
        was_leader = self.lease.epoch is not None
        try:
            leader = self.lease.acquire_or_renew()
        except Exception as error:  # the database is away: we cannot lead meanwhile
            log.warning("scheduler lease heartbeat failed: %s", str(error).splitlines()[0] if str(error) else error)
            return
        if leader and not was_leader:
            abandoned = abandon_stale_runs(self.engine, self.holder)
            log.info("scheduler %s leads (epoch %s); %d stale job run(s) abandoned", self.holder, self.lease.epoch,
                     abandoned)  # fmt: skip

    def _schema_at_head(self) -> bool:
        """Whether the schema is migrated, so that the lease and job tables exist; says once while it waits.

        A sidecar migrates in its API's start-up, after this service started: until then the lease
        table may be missing, which is not a database failure to warn about.
        """
        try:
            revision = current_revision(self.engine)
        except Exception as error:  # unreachable: the lease heartbeat's own warning would say the same
            log.warning("scheduler cannot read the schema revision: %s", type(error).__name__)
            return False
        self._schema_ready = revision == self._head
        if not self._schema_ready and not self._waiting_said:
            log.info("scheduler %s waits for the schema (at %s, head %s) before it takes the lease", self.holder,
                     revision or "empty", self._head)  # fmt: skip
            self._waiting_said = True
        return self._schema_ready

    def _run(self, name: str) -> None:
        if not self.lease.held:
            return
        tick = tick_of(datetime.now(UTC), intervals(self.settings)[name], grid_starts(self.settings)[name])
        with self._serial if name in SERIAL_JOBS else contextlib.nullcontext():
            status = run_tick(self.engine, self.settings, self.lease, name, tick, JOBS[name])
        log.debug("job %s tick %s: %s", name, tick.isoformat(), status)


def _engine(settings: Settings) -> Engine:
    """The scheduler's own engine; on PostgreSQL each statement bounded by ``scheduler.statement_timeout_s``."""
    timeout_ms = round(settings.scheduler.statement_timeout_s * 1000)
    if normalize_url(settings.database.url).get_backend_name() != "postgresql" or timeout_ms <= 0:
        return create_engine(settings.database.url)
    return create_engine(settings.database.url, connect_args={"options": f"-c statement_timeout={timeout_ms}"})
