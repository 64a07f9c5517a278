"""The delivery worker: one pass over the outbox, with retries, backoff, Retry-After and dead letters.

Per pass, notifications are taken in outbox order; a notification waits while an older one of the
same receiver and group is still pending, so a receiver sees each alert's changes in order. A
notification is *claimed* (``claimed_until``) before it is sent, so two workers (the scheduler and
``draftwatch alerts deliver``) never send it at once; delivery is at least once, and the stable
``webhook-id`` lets a receiver drop the duplicate a crash between send and record could cause.

Outcomes: 2xx delivered; 408, 429, 5xx, timeouts and connection errors retried after
``backoff_base_s * 2**(attempt-1)`` (capped at ``backoff_max_s``, times a random factor in
[0.5, 1)) or the receiver's ``Retry-After`` if longer; any other status is permanent. After
``max_attempts`` or ``max_age`` a notification is dead: kept, listed by the API, alerted on.
Logs name the receiver and its host, never the URL's path, the body or the secret.
"""

from __future__ import annotations

import email.utils
import logging
import os
import random
import socket
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import httpx
from sqlalchemy import or_, select, update
from sqlalchemy.engine import Engine

from monitor.notify.models import NotificationRow
from monitor.notify.receivers import WebhookReceiver
from monitor.notify.settings import DeliverySettings
from monitor.notify.signing import headers

log = logging.getLogger(__name__)

RETRYABLE: Final = frozenset({408, 429})
CLAIM_MARGIN: Final = timedelta(seconds=30)
N = NotificationRow


@dataclass(slots=True)
class DeliveryReport:
    attempted: int = 0
    delivered: int = 0
    retried: int = 0
    dead: int = 0
    waiting: int = 0


def backoff(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Delay before retry ``attempt`` (1-based): exponential, capped, with jitter in [0.5, 1).

    >>> 2.5 <= backoff(1, 5, 900) < 5, 450 <= backoff(30, 5, 900) < 900
    (True, True)
    """
    draw = (rng or random).random()
    return float(min(cap, base * 2 ** min(attempt - 1, 60)) * (0.5 + 0.5 * draw))


def retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds from a ``Retry-After`` header: delta-seconds or an HTTP date; None when absent or bad.

    >>> retry_after("120", datetime(2026, 1, 1, tzinfo=UTC))
    120.0
    >>> retry_after("Thu, 01 Jan 2026 00:01:00 GMT", datetime(2026, 1, 1, tzinfo=UTC))
    60.0
    """
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


def deliver_pending(
    engine: Engine,
    config: DeliverySettings,
    *,
    now: datetime | None = None,
    client: httpx.Client | None = None,
    limit: int = 500,
    rng: random.Random | None = None,
) -> DeliveryReport:
    """Run one delivery pass now; returns what it did."""
    receivers = {r.name: r for r in config.receivers}
    worker = f"{socket.gethostname()}:{os.getpid()}"
    report = DeliveryReport()
    with engine.connect() as conn:
        candidates = conn.execute(
            select(N.id, N.receiver, N.group_key, N.next_attempt_at, N.claimed_until)
            .where(N.status == "pending")
            .order_by(N.id)
            .limit(limit)
        ).all()
    if not candidates:
        # Most passes: no client made. Making one loads the CA bundle, tens of milliseconds that hold the GIL
        # away from a sidecar's event loop in slices of a few (the proxy's p99, every scheduler.delivery_interval).
        return report
    own_client = client is None
    http = client or httpx.Client(timeout=config.timeout_s, follow_redirects=False)
    blocked_groups: set[tuple[str, str]] = set()
    blocked_receivers: set[str] = set()
    try:
        for row in candidates:
            t = now or datetime.now(UTC)
            key = (row.receiver, row.group_key)
            if key in blocked_groups or row.receiver in blocked_receivers:
                report.waiting += 1
                continue
            if row.next_attempt_at > t or (row.claimed_until is not None and row.claimed_until > t):
                blocked_groups.add(key)  # an older notification of this group waits: so do the newer
                report.waiting += 1
                continue
            receiver = receivers.get(row.receiver)
            if receiver is None or (config.allowed_hosts and receiver.host not in config.allowed_hosts):
                why: str | None = "receiver no longer configured" if receiver is None else "host not allowed"
                _finish(engine, row.id, "dead", None, why, t)
                where = "" if receiver is None else f" ({receiver.safe_url}, not in delivery.allowed_hosts)"
                log.warning("webhook %s%s: dead letter %s: %s", row.receiver, where, row.id, why)
                report.dead += 1
                continue
            claimed = _claim(engine, row.id, worker, t + timedelta(seconds=config.timeout_s) + CLAIM_MARGIN, t)
            if claimed is None:
                blocked_groups.add(key)
                continue
            report.attempted += 1
            outcome = _send(http, receiver, claimed, config)
            done = now or datetime.now(UTC)
            if outcome.delivered:
                _finish(engine, row.id, "delivered", outcome.status, None, done)
                report.delivered += 1
                continue
            blocked_groups.add(key)
            if outcome.transport:
                blocked_receivers.add(receiver.name)  # one timeout per receiver and pass, not one per row
            attempts = int(claimed.attempts) + 1
            too_old = done - claimed.created_at >= config.max_age
            if not outcome.retryable or attempts >= config.max_attempts or too_old:
                why = f"gave up after {attempts} attempt(s): {outcome.error}" if outcome.retryable else outcome.error
                _finish(engine, row.id, "dead", outcome.status, why, done, attempts)
                log.warning("webhook %s (%s): dead letter %s: %s", receiver.name, receiver.safe_url, row.id, why)
                report.dead += 1
                continue
            delay = backoff(attempts, config.backoff_base_s, config.backoff_max_s, rng)
            if outcome.retry_after is not None:
                delay = max(delay, min(outcome.retry_after, config.backoff_max_s))
            _retry(engine, row.id, attempts, done + timedelta(seconds=delay), outcome.status, outcome.error)
            log.info(
                "webhook %s (%s): attempt %d failed (%s); retry in %.1f s",
                receiver.name, receiver.safe_url, attempts, outcome.error, delay,
            )  # fmt: skip
            report.retried += 1
    finally:
        if own_client:
            http.close()
    return report


@dataclass(frozen=True, slots=True)
class _Outcome:
    delivered: bool
    retryable: bool
    status: int | None
    error: str | None
    transport: bool = False
    retry_after: float | None = None


def _send(http: httpx.Client, receiver: WebhookReceiver, row: Any, config: DeliverySettings) -> _Outcome:
    stamp = datetime.now(UTC)
    body: str = row.body
    sent = headers(row.notification_id, int(stamp.timestamp()), body, receiver.secret)
    try:
        response = http.post(receiver.endpoint, content=body.encode(), headers=sent, timeout=config.timeout_s)
    except httpx.TimeoutException:
        return _Outcome(False, True, None, "timeout", transport=True)
    except httpx.HTTPError as error:
        # The exception text may quote the URL (and a Slack URL's path is its credential): type only.
        return _Outcome(False, True, None, type(error).__name__, transport=True)
    status = response.status_code
    if 200 <= status < 300:
        return _Outcome(True, False, status, None)
    retryable = status in RETRYABLE or status >= 500
    after = retry_after(response.headers.get("retry-after"), datetime.now(UTC)) if retryable else None
    return _Outcome(False, retryable, status, f"HTTP {status}", retry_after=after)


def _claim(engine: Engine, row_id: int, worker: str, until: datetime, now: datetime) -> Any:
    with engine.begin() as conn:
        claimed = conn.execute(
            update(N)
            .where(
                N.id == row_id,
                N.status == "pending",
                N.next_attempt_at <= now,
                or_(N.claimed_until.is_(None), N.claimed_until <= now),
            )
            .values(claimed_until=until, claimed_by=worker)
        )
        if claimed.rowcount != 1:
            return None
        return conn.execute(select(N.notification_id, N.body, N.attempts, N.created_at).where(N.id == row_id)).one()


def _finish(
    engine: Engine,
    row_id: int,
    status: str,
    http_status: int | None,
    error: str | None,
    now: datetime,
    attempts: int | None = None,
) -> None:
    values: dict[str, Any] = {"status": status, "last_status": http_status, "last_error": error, "claimed_until": None}
    if status == "delivered":
        values |= {"delivered_at": now, "attempts": N.attempts + 1}
    elif attempts is not None:
        values["attempts"] = attempts
    with engine.begin() as conn:
        conn.execute(update(N).where(N.id == row_id).values(**values))


def _retry(engine: Engine, row_id: int, attempts: int, when: datetime, status: int | None, error: str | None) -> None:
    values = {"attempts": attempts, "next_attempt_at": when, "last_status": status, "last_error": error}
    with engine.begin() as conn:
        conn.execute(update(N).where(N.id == row_id).values(claimed_until=None, **values))
