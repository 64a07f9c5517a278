"""Settings: one declarative table, read from an injected environment and an optional ``draftwatch.toml``.

Precedence is environment variable, then the config file, then the default. Every setting is one
row of :data:`SETTINGS` (its dotted name, environment variable, default, help) plus one field of
:class:`Settings`; a test keeps the two in step, and the README test checks that the docs list every
row. Adding a setting (API tokens, webhooks, scheduler intervals, ...) means adding both.

The dotted name is also the location in the TOML file: ``recorder.queue_size`` is the key
``queue_size`` of the ``[recorder]`` table; names without a dot are top-level keys.

>>> s = Settings.from_env({"HOME": "/home/ada", "DRAFTWATCH_RECORDER_BATCH_SIZE": "250"}, None)
>>> s.recorder_batch_size, s.database_url
(250, 'sqlite:////home/ada/.local/share/draftwatch/draftwatch.db')
>>> Settings.from_env({"HOME": "/h", "DRAFTWATCH_RECORDER_BATCH_SIZE": "many"}, None)
Traceback (most recent call last):
...
monitor.config.ConfigError: DRAFTWATCH_RECORDER_BATCH_SIZE='many': expected an integer
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Final, NamedTuple

from decoder.holdout import HoldoutPolicy
from monitor.alerts.rules import DEFAULT_RULES, Rule, parse_rules
from monitor.notify.receivers import WebhookReceiver, parse_hosts, parse_webhooks

FULL_QUEUE_POLICIES: Final = ("block_then_spool", "spool", "raise")
DEFAULT_CONFIG_FILE: Final = "draftwatch.toml"
CONFIG_FILE_ENV: Final = "DRAFTWATCH_CONFIG"


class ConfigError(ValueError):
    """A setting has a bad value; the message quotes where it came from and the value."""


# A parser turns the raw value (a string from the environment, any TOML value from the file) into
# the typed value, raising ValueError with a short "expected ..." phrase on failure.
Parser = Callable[[Any], Any]


def _parse_int(minimum: int) -> Parser:
    def parse(raw: Any) -> int:
        if isinstance(raw, bool):
            raise ValueError("expected an integer")
        try:
            value = int(raw)
        except (TypeError, ValueError):
            raise ValueError("expected an integer") from None
        if isinstance(raw, float) and raw != value:
            raise ValueError("expected an integer")
        if value < minimum:
            raise ValueError(f"expected an integer >= {minimum}")
        return value

    return parse


def _parse_seconds(raw: Any) -> float:
    if isinstance(raw, bool):
        raise ValueError("expected a number of seconds")
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ValueError("expected a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError("expected a finite, non-negative number of seconds")
    return value


def _parse_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _parse_str(raw: Any) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError("expected a non-empty string")
    return raw.strip()


def _parse_path(raw: Any) -> Path:
    return Path(_parse_str(raw)).expanduser()


def _parse_choice(choices: tuple[str, ...]) -> Parser:
    def parse(raw: Any) -> str:
        if raw not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return str(raw)

    return parse


def _parse_database_url(raw: Any) -> str:
    url = _parse_str(raw)
    if not url.startswith(("sqlite:", "postgresql:", "postgresql+", "postgres:")):
        raise ValueError("expected a sqlite:/// or postgresql+psycopg:// URL")
    return url


_DURATION_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(raw: Any) -> timedelta:
    """``15m``, ``6h``, ``7d``, ``90s``, ``2w`` (or a number of seconds) as a positive timedelta.

    >>> parse_duration("6h"), parse_duration("90")
    (datetime.timedelta(seconds=21600), datetime.timedelta(seconds=90))
    """
    text = str(raw).strip().lower()
    unit = text[-1:] if text[-1:] in _DURATION_UNITS else "s"
    number = text[:-1] if text[-1:] in _DURATION_UNITS else text
    try:
        value = float(number) * _DURATION_UNITS[unit]
    except ValueError:
        raise ValueError("expected a duration like 15m, 6h or 7d") from None
    if not 0 < value < 10 * 365 * 86400:
        raise ValueError("expected a positive duration like 15m, 6h or 7d")
    return timedelta(seconds=value)


def format_duration(value: timedelta) -> str:
    """The largest whole unit that reads ``value`` exactly: the inverse of :func:`parse_duration`.

    >>> format_duration(timedelta(hours=2)), format_duration(timedelta(seconds=90))
    ('2h', '90s')
    """
    seconds = int(value.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _parse_fraction(raw: Any) -> float:
    if isinstance(raw, bool):
        raise ValueError("expected a number between 0 and 1")
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ValueError("expected a number between 0 and 1") from None
    if not 0 < value < 1:
        raise ValueError("expected a number between 0 and 1")
    return value


# Per-workload effect floors of the drift tests, e.g. "chat:acceptance=0.08,latency=0.2;code:acceptance=0.1".
FLOOR_KEYS: Final = ("acceptance", "latency", "psi")


def _parse_workload_floors(raw: Any) -> tuple[tuple[str, str, float], ...]:
    if not isinstance(raw, str):
        raise ValueError("expected a string like 'chat:acceptance=0.08,latency=0.2;code:acceptance=0.1'")
    found: list[tuple[str, str, float]] = []
    for part in filter(None, (p.strip() for p in raw.split(";"))):
        workload, _, assignments = part.partition(":")
        for assignment in filter(None, (a.strip() for a in assignments.split(","))):
            key, _, value = assignment.partition("=")
            if not workload.strip() or key.strip() not in FLOOR_KEYS:
                raise ValueError(f"expected WORKLOAD:KEY=VALUE with KEY one of {', '.join(FLOOR_KEYS)}")
            try:
                found.append((workload.strip(), key.strip(), float(value)))
            except ValueError:
                raise ValueError(f"expected a number after {key.strip()}=") from None
    return tuple(found)


API_SCOPES: Final = ("ingest", "read", "admin")
API_TOKEN_MIN_LENGTH: Final = 16


class ApiToken(NamedTuple):
    """One bearer token of the sidecar API and its scope; the repr never shows the token."""

    scope: str
    token: str

    def __repr__(self) -> str:
        return f"ApiToken(scope={self.scope!r}, token='***')"


def _parse_api_tokens(raw: Any) -> tuple[ApiToken, ...]:
    """``ingest:TOKEN,admin:TOKEN`` (comma-separated ``scope:token`` pairs); the message never quotes a token."""
    if not isinstance(raw, str):
        raise ValueError("expected comma-separated scope:token pairs")
    tokens: list[ApiToken] = []
    for number, part in enumerate(filter(None, (p.strip() for p in raw.split(","))), start=1):
        scope, _, token = part.partition(":")
        if scope.strip() not in API_SCOPES:
            raise ValueError(f"pair {number}: scope must be one of {', '.join(API_SCOPES)}")
        if len(token.strip()) < API_TOKEN_MIN_LENGTH or any(c.isspace() for c in token.strip()):
            raise ValueError(f"pair {number}: token must be at least {API_TOKEN_MIN_LENGTH} characters, no spaces")
        tokens.append(ApiToken(scope.strip(), token.strip()))
    return tuple(tokens)


def _parse_port(raw: Any) -> int:
    port = _parse_int(0)(raw)
    if port > 65535:
        raise ValueError("expected a port number 0-65535")
    return int(port)


def _parse_share(raw: Any) -> float:
    if isinstance(raw, bool):
        raise ValueError("expected a share between 0 and 1")
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ValueError("expected a share between 0 and 1") from None
    if not 0 <= value <= 1:
        raise ValueError("expected a share between 0 and 1")
    return value


@dataclass(frozen=True, slots=True)
class SettingSpec:
    """One row of the settings table.

    ``default`` receives the settings resolved so far (rows are resolved in table order, so a
    default may depend on an earlier row, e.g. paths inside ``data_dir``) and the environment.
    """

    name: str
    env: str
    field: str
    parse: Parser
    default: Callable[[dict[str, Any], Mapping[str, str]], Any]
    help: str
    # Secret values (API tokens) are never quoted in error messages.
    secret: bool = False


def _default_data_dir(_: dict[str, Any], environ: Mapping[str, str]) -> Path:
    # XDG first, as Linux desktop tools do; HOME comes from the injected mapping so tests stay hermetic.
    if environ.get("XDG_DATA_HOME"):
        return Path(environ["XDG_DATA_HOME"]) / "draftwatch"
    home = Path(environ["HOME"]) if environ.get("HOME") else Path.home()
    return home / ".local" / "share" / "draftwatch"


def _const(value: Any) -> Callable[[dict[str, Any], Mapping[str, str]], Any]:
    return lambda _resolved, _environ: value


SETTINGS: Final[tuple[SettingSpec, ...]] = (
    SettingSpec(
        "data_dir",
        "DRAFTWATCH_DATA_DIR",
        "data_dir",
        _parse_path,
        _default_data_dir,
        "directory for the default SQLite database and the recorder's spool "
        "(default: $XDG_DATA_HOME/draftwatch or ~/.local/share/draftwatch)",
    ),
    SettingSpec(
        "database.url",
        "DRAFTWATCH_DATABASE_URL",
        "database_url",
        _parse_database_url,
        lambda r, _e: f"sqlite:///{r['data_dir'] / 'draftwatch.db'}",
        "SQLAlchemy URL: sqlite:///PATH or postgresql+psycopg://USER@HOST/DB (default: draftwatch.db in data_dir)",
    ),
    SettingSpec(
        "database.upgrade_on_start",
        "DRAFTWATCH_DATABASE_UPGRADE_ON_START",
        "database_upgrade_on_start",
        _parse_bool,
        _const(True),
        "run the schema migrations when a service starts (default: true)",
    ),
    SettingSpec(
        "recorder.queue_size",
        "DRAFTWATCH_RECORDER_QUEUE_SIZE",
        "recorder_queue_size",
        _parse_int(1),
        _const(20_000),
        "records the recorder holds in memory before the full-queue policy applies",
    ),
    SettingSpec(
        "recorder.batch_size",
        "DRAFTWATCH_RECORDER_BATCH_SIZE",
        "recorder_batch_size",
        _parse_int(1),
        _const(1000),
        "records per database transaction",
    ),
    SettingSpec(
        "recorder.flush_interval_s",
        "DRAFTWATCH_RECORDER_FLUSH_INTERVAL_S",
        "recorder_flush_interval_s",
        _parse_seconds,
        _const(0.2),
        "longest time a record waits in the queue before its batch is written",
    ),
    SettingSpec(
        "recorder.full_queue_policy",
        "DRAFTWATCH_RECORDER_FULL_QUEUE_POLICY",
        "recorder_full_queue_policy",
        _parse_choice(FULL_QUEUE_POLICIES),
        _const("block_then_spool"),
        "what record() does when the queue is full: block_then_spool (wait up to block_timeout_s, then "
        "append to the spool on the caller's thread), spool (at once), raise (RecorderFullError)",
    ),
    SettingSpec(
        "recorder.block_timeout_s",
        "DRAFTWATCH_RECORDER_BLOCK_TIMEOUT_S",
        "recorder_block_timeout_s",
        _parse_seconds,
        _const(0.05),
        "how long record() waits for room under block_then_spool",
    ),
    SettingSpec(
        "recorder.retry_interval_s",
        "DRAFTWATCH_RECORDER_RETRY_INTERVAL_S",
        "recorder_retry_interval_s",
        _parse_seconds,
        _const(1.0),
        "how often the recorder retries an unreachable database",
    ),
    SettingSpec(
        "recorder.writer_threads",
        "DRAFTWATCH_RECORDER_WRITER_THREADS",
        "recorder_writer_threads",
        _parse_int(1),
        _const(1),
        "background writer threads (2 helps ingest throughput on PostgreSQL; SQLite gains nothing)",
    ),
    SettingSpec(
        "recorder.spool_dir",
        "DRAFTWATCH_RECORDER_SPOOL_DIR",
        "recorder_spool_dir",
        _parse_path,
        lambda r, _e: r["data_dir"] / "spool",
        "directory of the recorder's append-only spool files (default: spool/ in data_dir)",
    ),
    SettingSpec(
        "api.host",
        "DRAFTWATCH_API_HOST",
        "api_host",
        _parse_str,
        _const("127.0.0.1"),
        "address `draftwatch serve` binds; anything but loopback needs api.tokens (default: 127.0.0.1)",
    ),
    SettingSpec(
        "api.port",
        "DRAFTWATCH_API_PORT",
        "api_port",
        _parse_port,
        _const(8321),
        "TCP port of `draftwatch serve` (default: 8321)",
    ),
    SettingSpec(
        "api.tokens",
        "DRAFTWATCH_API_TOKENS",
        "api_tokens",
        _parse_api_tokens,
        _const(()),
        "bearer tokens of the API as comma-separated scope:token pairs, scopes ingest, read, admin "
        "(admin may do everything); none configured: no auth, loopback only",
        secret=True,
    ),
    SettingSpec(
        "api.max_batch_size",
        "DRAFTWATCH_API_MAX_BATCH_SIZE",
        "api_max_batch_size",
        _parse_int(1),
        _const(10_000),
        "most records in one POST /v1/events (default: 10000)",
    ),
    SettingSpec(
        "api.max_body_bytes",
        "DRAFTWATCH_API_MAX_BODY_BYTES",
        "api_max_body_bytes",
        _parse_int(1024),
        _const(16 * 1024 * 1024),
        "largest request body the API reads, in bytes (default: 16 MiB)",
    ),
    SettingSpec(
        "api.request_timeout_s",
        "DRAFTWATCH_API_REQUEST_TIMEOUT_S",
        "api_request_timeout_s",
        _parse_seconds,
        _const(60.0),
        "longest time from a request's arrival to its response's start; 0 disables (default: 60)",
    ),
    SettingSpec(
        "api.decode_queue_size",
        "DRAFTWATCH_API_DECODE_QUEUE_SIZE",
        "api_decode_queue_size",
        _parse_int(1),
        _const(16),
        "generation requests waiting for the decoder; beyond that the API answers 503 (default: 16)",
    ),
    SettingSpec(
        "decoder.holdout_share",
        "DRAFTWATCH_HOLDOUT_SHARE",
        "holdout_share",
        _parse_share,
        _const(0.05),
        "share of a workload's requests decoded without speculation (mode holdout) to measure the speedup, once it "
        "has decoder.holdout_target of them in the last drift.current_window (default: 0.05)",
    ),
    SettingSpec(
        "decoder.holdout_target",
        "DRAFTWATCH_HOLDOUT_TARGET",
        "holdout_target",
        _parse_int(0),
        _const(30),
        "holdout requests per workload and drift.current_window that the measured net-loss test needs; below it a "
        "workload's requests are held out at decoder.holdout_max_share (default: 30, as drift.min_requests; 0: off)",
    ),
    SettingSpec(
        "decoder.holdout_max_share",
        "DRAFTWATCH_HOLDOUT_MAX_SHARE",
        "holdout_max_share",
        _parse_share,
        _const(0.2),
        "share held out while a workload is below decoder.holdout_target: the most a small workload pays for "
        "measuring its speedup (default: 0.2)",
    ),
    SettingSpec(
        "drift.current_window",
        "DRAFTWATCH_DRIFT_CURRENT_WINDOW",
        "drift_current_window",
        parse_duration,
        _const(timedelta(hours=1)),
        "length of the current window of a drift run, e.g. 15m, 6h (default: 1h)",
    ),
    SettingSpec(
        "drift.max_current_window",
        "DRAFTWATCH_DRIFT_MAX_CURRENT_WINDOW",
        "drift_max_current_window",
        parse_duration,
        _const(timedelta(hours=8)),
        "longest the current window of a workload widens to (doubling) while it holds fewer than drift.min_requests "
        "speculative requests; equal to drift.current_window turns widening off (default: 8h)",
    ),
    SettingSpec(
        "drift.reference_window",
        "DRAFTWATCH_DRIFT_REFERENCE_WINDOW",
        "drift_reference_window",
        parse_duration,
        _const(timedelta(days=1)),
        "length of the rolling reference window just before the current one (default: 1d)",
    ),
    SettingSpec(
        "drift.fdr_level",
        "DRAFTWATCH_DRIFT_FDR_LEVEL",
        "drift_fdr_level",
        _parse_fraction,
        _const(0.01),
        "Benjamini-Hochberg false-discovery level across one drift run (default: 0.01)",
    ),
    SettingSpec(
        "drift.min_requests",
        "DRAFTWATCH_DRIFT_MIN_REQUESTS",
        "drift_min_requests",
        _parse_int(5),
        _const(30),
        "fewest requests per window for a test to decide; fewer gives insufficient_data (default: 30)",
    ),
    SettingSpec(
        "drift.sample_size",
        "DRAFTWATCH_DRIFT_SAMPLE_SIZE",
        "drift_sample_size",
        _parse_int(50),
        _const(2000),
        "most requests read per window and workload (a deterministic hash sample) (default: 2000)",
    ),
    SettingSpec(
        "drift.acceptance_floor",
        "DRAFTWATCH_DRIFT_ACCEPTANCE_FLOOR",
        "drift_acceptance_floor",
        _parse_fraction,
        _const(0.05),
        "smallest change of mean per-request acceptance that counts as drift (default: 0.05 = 5 points)",
    ),
    SettingSpec(
        "drift.latency_floor",
        "DRAFTWATCH_DRIFT_LATENCY_FLOOR",
        "drift_latency_floor",
        _parse_seconds,
        _const(0.10),
        "smallest relative rise of p95 latency (ms per token, TTFT, end-to-end) that counts (default: 0.10)",
    ),
    SettingSpec(
        "drift.workload_floors",
        "DRAFTWATCH_DRIFT_WORKLOAD_FLOORS",
        "drift_workload_floors",
        _parse_workload_floors,
        _const(()),
        "per-workload floors, 'chat:acceptance=0.08,latency=0.2;code:psi=0.5' (keys: acceptance, latency, psi)",
    ),
    SettingSpec(
        "webhooks",
        "DRAFTWATCH_WEBHOOKS",
        "webhooks",
        parse_webhooks,
        _const(()),
        "webhook receivers: [[webhooks]] tables (url, format alertmanager|slack|json, secret whsec_..., name) or a "
        "JSON list of the same in the environment (default: none)",
        secret=True,
    ),
    SettingSpec(
        "delivery.allowed_hosts",
        "DRAFTWATCH_DELIVERY_ALLOWED_HOSTS",
        "delivery_allowed_hosts",
        parse_hosts,
        _const(()),
        "hosts webhooks may be sent to, comma-separated; empty allows any (default: empty)",
    ),
    SettingSpec(
        "delivery.timeout_s",
        "DRAFTWATCH_DELIVERY_TIMEOUT_S",
        "delivery_timeout_s",
        _parse_seconds,
        _const(10.0),
        "timeout of one webhook request, connect and read (default: 10)",
    ),
    SettingSpec(
        "delivery.max_attempts",
        "DRAFTWATCH_DELIVERY_MAX_ATTEMPTS",
        "delivery_max_attempts",
        _parse_int(1),
        _const(12),
        "attempts before a notification becomes a dead letter (default: 12)",
    ),
    SettingSpec(
        "delivery.max_age",
        "DRAFTWATCH_DELIVERY_MAX_AGE",
        "delivery_max_age",
        parse_duration,
        _const(timedelta(days=1)),
        "age after which an undelivered notification becomes a dead letter (default: 1d)",
    ),
    SettingSpec(
        "delivery.backoff_base_s",
        "DRAFTWATCH_DELIVERY_BACKOFF_BASE_S",
        "delivery_backoff_base_s",
        _parse_seconds,
        _const(5.0),
        "first retry delay; doubles per attempt, with jitter (default: 5)",
    ),
    SettingSpec(
        "delivery.backoff_max_s",
        "DRAFTWATCH_DELIVERY_BACKOFF_MAX_S",
        "delivery_backoff_max_s",
        _parse_seconds,
        _const(900.0),
        "longest retry delay, also the cap on a receiver's Retry-After (default: 900)",
    ),
    SettingSpec(
        "alerts.rules",
        "DRAFTWATCH_ALERT_RULES",
        "alert_rules",
        parse_rules,
        _const(DEFAULT_RULES),
        "[[alerts.rules]] tables (JSON list in the environment) overriding or adding to the default rules "
        "(see docs/alerts.md)",
    ),
    SettingSpec(
        "alerts.for_runs",
        "DRAFTWATCH_ALERTS_FOR_RUNS",
        "alerts_for_runs",
        _parse_int(1),
        _const(2),
        "consecutive active evaluations before a pending alert fires (default: 2)",
    ),
    SettingSpec(
        "alerts.clear_runs",
        "DRAFTWATCH_ALERTS_CLEAR_RUNS",
        "alerts_clear_runs",
        _parse_int(1),
        _const(2),
        "consecutive clear evaluations before a firing alert resolves (default: 2)",
    ),
    SettingSpec(
        "alerts.repeat_interval",
        "DRAFTWATCH_ALERTS_REPEAT_INTERVAL",
        "alerts_repeat_interval",
        parse_duration,
        _const(timedelta(hours=4)),
        "how often a firing, unacknowledged alert is notified again (default: 4h)",
    ),
    SettingSpec(
        "alerts.group_by",
        "DRAFTWATCH_ALERTS_GROUP_BY",
        "alerts_group_by",
        parse_hosts,
        _const(("workload",)),
        "labels whose values group alerts into one notification, comma-separated (default: workload)",
    ),
    SettingSpec(
        "alerts.flap_window",
        "DRAFTWATCH_ALERTS_FLAP_WINDOW",
        "alerts_flap_window",
        parse_duration,
        _const(timedelta(hours=1)),
        "window in which repeated firing counts as flapping (default: 1h)",
    ),
    SettingSpec(
        "alerts.flap_max_fires",
        "DRAFTWATCH_ALERTS_FLAP_MAX_FIRES",
        "alerts_flap_max_fires",
        _parse_int(1),
        _const(3),
        "firing notifications per alert within flap_window; more are held back (default: 3)",
    ),
    SettingSpec(
        "scheduler.drift_interval",
        "DRAFTWATCH_SCHEDULER_DRIFT_INTERVAL",
        "scheduler_drift_interval",
        parse_duration,
        _const(timedelta(minutes=5)),
        "how often the drift run (and alert evaluation) job runs (default: 5m)",
    ),
    SettingSpec(
        "scheduler.delivery_interval",
        "DRAFTWATCH_SCHEDULER_DELIVERY_INTERVAL",
        "scheduler_delivery_interval",
        parse_duration,
        _const(timedelta(seconds=10)),
        "how often the webhook delivery job runs (default: 10s)",
    ),
    SettingSpec(
        "scheduler.health_interval",
        "DRAFTWATCH_SCHEDULER_HEALTH_INTERVAL",
        "scheduler_health_interval",
        parse_duration,
        _const(timedelta(minutes=1)),
        "how often the health alerts (scheduler, recorder spool, dead letters) are evaluated (default: 1m)",
    ),
    SettingSpec(
        "scheduler.retention_interval",
        "DRAFTWATCH_SCHEDULER_RETENTION_INTERVAL",
        "scheduler_retention_interval",
        parse_duration,
        _const(timedelta(days=1)),
        "how often the retention job deletes old rows (default: 1d)",
    ),
    SettingSpec(
        "scheduler.misfire_grace_s",
        "DRAFTWATCH_SCHEDULER_MISFIRE_GRACE_S",
        "scheduler_misfire_grace_s",
        _parse_seconds,
        _const(60.0),
        "how late a job may still start after its time (default: 60)",
    ),
    SettingSpec(
        "scheduler.coalesce",
        "DRAFTWATCH_SCHEDULER_COALESCE",
        "scheduler_coalesce",
        _parse_bool,
        _const(True),
        "run a job once, not once per missed time, after a delay (default: true)",
    ),
    SettingSpec(
        "scheduler.max_instances",
        "DRAFTWATCH_SCHEDULER_MAX_INSTANCES",
        "scheduler_max_instances",
        _parse_int(1),
        _const(1),
        "concurrent runs of one job in one process (default: 1)",
    ),
    SettingSpec(
        "scheduler.lease_ttl_s",
        "DRAFTWATCH_SCHEDULER_LEASE_TTL_S",
        "scheduler_lease_ttl_s",
        _parse_seconds,
        _const(30.0),
        "leader lease lifetime: a replica that stops renewing loses the lease after this (default: 30)",
    ),
    SettingSpec(
        "scheduler.heartbeat_s",
        "DRAFTWATCH_SCHEDULER_HEARTBEAT_S",
        "scheduler_heartbeat_s",
        _parse_seconds,
        _const(10.0),
        "how often replicas renew or try to take the lease; keep well below lease_ttl_s (default: 10)",
    ),
    SettingSpec(
        "scheduler.failure_alert_after",
        "DRAFTWATCH_SCHEDULER_FAILURE_ALERT_AFTER",
        "scheduler_failure_alert_after",
        _parse_int(1),
        _const(3),
        "consecutive failures of a job that raise the scheduler alert (default: 3)",
    ),
    SettingSpec(
        "retention.requests_days",
        "DRAFTWATCH_RETENTION_REQUESTS_DAYS",
        "retention_requests_days",
        _parse_int(0),
        _const(30),
        "days of requests kept; 0 keeps everything (default: 30)",
    ),
    SettingSpec(
        "retention.rollups_days",
        "DRAFTWATCH_RETENTION_ROLLUPS_DAYS",
        "retention_rollups_days",
        _parse_int(0),
        _const(400),
        "days of per-minute rollups kept; 0 keeps everything (default: 400)",
    ),
    SettingSpec(
        "retention.drift_days",
        "DRAFTWATCH_RETENTION_DRIFT_DAYS",
        "retention_drift_days",
        _parse_int(0),
        _const(90),
        "days of drift runs and results kept; 0 keeps everything (default: 90)",
    ),
    SettingSpec(
        "retention.alerts_days",
        "DRAFTWATCH_RETENTION_ALERTS_DAYS",
        "retention_alerts_days",
        _parse_int(0),
        _const(90),
        "days of finished notifications, resolved alerts and expired silences kept; 0 keeps all (default: 90)",
    ),
    SettingSpec(
        "retention.jobs_days",
        "DRAFTWATCH_RETENTION_JOBS_DAYS",
        "retention_jobs_days",
        _parse_int(0),
        _const(14),
        "days of job history kept; 0 keeps everything (default: 14)",
    ),
)


@dataclass(frozen=True, slots=True)
class Settings:
    """Resolved settings; build with :meth:`from_env`. Field docs live in :data:`SETTINGS`."""

    data_dir: Path
    database_url: str
    database_upgrade_on_start: bool
    recorder_queue_size: int
    recorder_batch_size: int
    recorder_flush_interval_s: float
    recorder_full_queue_policy: str
    recorder_block_timeout_s: float
    recorder_retry_interval_s: float
    recorder_writer_threads: int
    recorder_spool_dir: Path
    api_host: str
    api_port: int
    api_tokens: tuple[ApiToken, ...]
    api_max_batch_size: int
    api_max_body_bytes: int
    api_request_timeout_s: float
    api_decode_queue_size: int
    holdout_share: float
    holdout_target: int
    holdout_max_share: float
    drift_current_window: timedelta
    drift_max_current_window: timedelta
    drift_reference_window: timedelta
    drift_fdr_level: float
    drift_min_requests: int
    drift_sample_size: int
    drift_acceptance_floor: float
    drift_latency_floor: float
    drift_workload_floors: tuple[tuple[str, str, float], ...]
    webhooks: tuple[WebhookReceiver, ...]
    delivery_allowed_hosts: tuple[str, ...]
    delivery_timeout_s: float
    delivery_max_attempts: int
    delivery_max_age: timedelta
    delivery_backoff_base_s: float
    delivery_backoff_max_s: float
    alert_rules: tuple[Rule, ...]
    alerts_for_runs: int
    alerts_clear_runs: int
    alerts_repeat_interval: timedelta
    alerts_group_by: tuple[str, ...]
    alerts_flap_window: timedelta
    alerts_flap_max_fires: int
    scheduler_drift_interval: timedelta
    scheduler_delivery_interval: timedelta
    scheduler_health_interval: timedelta
    scheduler_retention_interval: timedelta
    scheduler_misfire_grace_s: float
    scheduler_coalesce: bool
    scheduler_max_instances: int
    scheduler_lease_ttl_s: float
    scheduler_heartbeat_s: float
    scheduler_failure_alert_after: int
    retention_requests_days: int
    retention_rollups_days: int
    retention_drift_days: int
    retention_alerts_days: int
    retention_jobs_days: int

    @classmethod
    def from_env(cls, environ: Mapping[str, str], config_file: Path | None = None) -> Settings:
        """Resolve every setting from ``environ``, then ``config_file`` (TOML), then the defaults."""
        file_values = _read_config_file(config_file) if config_file is not None else {}
        resolved: dict[str, Any] = {}
        for spec in SETTINGS:
            if spec.env in environ:
                source, raw = spec.env, environ[spec.env]
            elif spec.name in file_values:
                source, raw = f"{config_file}: {spec.name}", file_values.pop(spec.name)
            else:
                resolved[spec.field] = spec.default(resolved, environ)
                continue
            try:
                resolved[spec.field] = spec.parse(raw)
            except ValueError as error:
                shown = "'<redacted>'" if spec.secret else repr(raw)
                raise ConfigError(f"{source}={shown}: {error}") from None
        file_values = {k: v for k, v in file_values.items() if k not in {s.name for s in SETTINGS}}
        if file_values:
            key = sorted(file_values)[0]
            raise ConfigError(f"{config_file}: {key}={file_values[key]!r}: unknown setting")
        return cls(**resolved)

    @property
    def holdout_policy(self) -> HoldoutPolicy:
        """The decoder's holdout: a floor share, and a target per workload and drift window."""
        return HoldoutPolicy(
            share=self.holdout_share,
            target=self.holdout_target,
            max_share=self.holdout_max_share,
            window_s=self.drift_current_window.total_seconds(),
        )

    def replace(self, **changes: Any) -> Settings:
        """A copy with some fields changed (tests and CLI flags)."""
        return dataclasses.replace(self, **changes)


def default_config_file(environ: Mapping[str, str], cwd: Path) -> Path | None:
    """The config file to read: ``$DRAFTWATCH_CONFIG`` if set, else ``./draftwatch.toml`` if it exists."""
    if environ.get(CONFIG_FILE_ENV):
        return Path(environ[CONFIG_FILE_ENV]).expanduser()
    candidate = cwd / DEFAULT_CONFIG_FILE
    return candidate if candidate.is_file() else None


def _read_config_file(path: Path) -> dict[str, Any]:
    """Flatten the TOML file into dotted names (``{"recorder": {"batch_size": 5}}`` -> ``recorder.batch_size``)."""
    try:
        with path.open("rb") as handle:
            document = tomllib.load(handle)
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the config file: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from None
    flat: dict[str, Any] = {}

    def walk(prefix: str, table: Mapping[str, Any]) -> None:
        for key, value in table.items():
            name = f"{prefix}{key}"
            if isinstance(value, dict):
                walk(f"{name}.", value)
            else:
                flat[name] = value

    walk("", document)
    return flat
