"""The scheduler's settings: how often each job runs, the leader lease, and how long rows are kept."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Final

from monitor.settings.fields import setting
from monitor.settings.parsers import parse_bool, parse_choice, parse_duration, parse_int, parse_seconds


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerSettings:
    drift_interval: timedelta = setting(
        "scheduler.drift_interval",
        parse_duration,
        timedelta(minutes=5),
        "how often the drift run (and alert evaluation) job runs",
    )
    delivery_interval: timedelta = setting(
        "scheduler.delivery_interval",
        parse_duration,
        timedelta(seconds=10),
        "how often the webhook delivery job runs",
    )
    health_interval: timedelta = setting(
        "scheduler.health_interval",
        parse_duration,
        timedelta(minutes=1),
        "how often the health alerts (scheduler, recorder spool, dead letters) are evaluated",
    )
    retention_interval: timedelta = setting(
        "scheduler.retention_interval",
        parse_duration,
        timedelta(days=1),
        "how often the retention job deletes old rows; it runs half a drift interval after a drift run's time "
        "(00:02:30 UTC daily by default) and never beside a drift run",
    )
    scrape_interval: timedelta = setting(
        "scheduler.scrape_interval",
        parse_duration,
        timedelta(seconds=15),
        "how often the scrape job looks for [[scrape]] targets due for their own interval",
    )
    rollout_interval: timedelta = setting(
        "scheduler.rollout_interval",
        parse_duration,
        timedelta(minutes=1),
        "how often a running drafter rollout is judged (draftwatch rollout): a failing workload rolls it back within "
        "this long",
    )
    misfire_grace_s: float = setting(
        "scheduler.misfire_grace_s",
        parse_seconds,
        60.0,
        "how late a job may still start after its time",
    )
    coalesce: bool = setting(
        "scheduler.coalesce",
        parse_bool,
        True,
        "run a job once, not once per missed time, after a delay",
    )
    max_instances: int = setting(
        "scheduler.max_instances",
        parse_int(1),
        1,
        "concurrent runs of one job in one process",
    )
    lease_ttl_s: float = setting(
        "scheduler.lease_ttl_s",
        parse_seconds,
        30.0,
        "leader lease lifetime: a replica that stops renewing loses the lease after this",
    )
    heartbeat_s: float = setting(
        "scheduler.heartbeat_s",
        parse_seconds,
        10.0,
        "how often replicas renew or try to take the lease; keep well below lease_ttl_s",
    )
    statement_timeout_s: float = setting(
        "scheduler.statement_timeout_s",
        parse_seconds,
        300.0,
        "longest one statement of a scheduled job may run on PostgreSQL (the statement_timeout of the scheduler's "
        "connections), so that no job's read holds requests for longer against retention's partition drops; past "
        "it the job fails and runs again on its next tick; 0: no bound",
    )
    failure_alert_after: int = setting(
        "scheduler.failure_alert_after",
        parse_int(1),
        3,
        "consecutive failures of a job that raise the scheduler alert",
    )


REQUESTS_EDGES: Final = ("keep", "delete")


@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionSettings:
    requests_days: int = setting(
        "retention.requests_days",
        parse_int(0),
        30,
        "days of requests kept; 0 keeps everything",
    )
    requests_edge: str = setting(
        "retention.requests_edge",
        parse_choice(REQUESTS_EDGES),
        "keep",
        "on partitioned PostgreSQL, the expired requests of the partition holding the cutoff: keep waits until the "
        "whole partition has expired and drops it (requests live up to database.partition_days past "
        "retention.requests_days; none is deleted row by row); delete removes them in batches (retention exact "
        "to the minute, at a delete's WAL and bloat); SQLite and an unpartitioned table always delete exactly",
    )
    rollups_days: int = setting(
        "retention.rollups_days",
        parse_int(0),
        400,
        "days of per-minute rollups kept; 0 keeps everything",
    )
    drift_days: int = setting(
        "retention.drift_days",
        parse_int(0),
        90,
        "days of drift runs and results kept; 0 keeps everything",
    )
    alerts_days: int = setting(
        "retention.alerts_days",
        parse_int(0),
        90,
        "days of finished notifications, resolved alerts and expired silences kept; 0 keeps all",
    )
    jobs_days: int = setting(
        "retention.jobs_days",
        parse_int(0),
        14,
        "days of job history kept; 0 keeps everything",
    )
    batches_days: int = setting(
        "retention.batches_days",
        parse_int(0),
        7,
        "days of committed recorder batch ids kept (one row per batch: about 432,000 a day at 1,000 records/s); "
        "a spool older than this still replays once, by request id; 0 keeps everything",
    )
    batch_size: int = setting(
        "retention.batch_size",
        parse_int(1),
        10_000,
        "most rows one retention transaction deletes: a table's expired rows go in transactions of this size, "
        "each committed before the next, so that no lock or WAL grows with the backlog",
    )
    partition_lock_wait_s: float = setting(
        "retention.partition_lock_wait_s",
        parse_seconds,
        120.0,
        "on partitioned PostgreSQL, how long retention keeps trying to drop an expired partition (or make one ahead) "
        "while a read holds its table: each try waits at most 50 ms for its lock, so that writers never queue "
        "behind it for longer, then pauses up to 2 s; past this the job fails and the next run drops it",
    )
    batch_timeout_s: float = setting(
        "retention.batch_timeout_s",
        parse_seconds,
        30.0,
        "longest one retention transaction may run on PostgreSQL (its statement_timeout); past it the job fails "
        "and the next run goes on from the rows left",
    )
