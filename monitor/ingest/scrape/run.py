"""One pass of scrape mode: every target whose interval has passed is read, its intervals and health stored.

Each target is scraped and written in its own transaction, fenced by the caller (the scheduler's
lease check), so that a replica that lost the lease writes nothing. The previous cumulative
counters live in ``scrape_targets``, not in memory: whichever replica leads next continues from
them. A failed scrape keeps them, so the first interval after an outage spans it and counts
everything the engine did meanwhile. Faults are the target's health (``down``: unreachable, a
timeout or an HTTP error; ``garbage``: a body that is not the engine's exposition), never an
interval: a target that stops answering is not a drop in acceptance.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import httpx
from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection, Engine, Row

from monitor.ingest.scrape.deltas import interval
from monitor.ingest.scrape.engines import EngineError, Reading, read
from monitor.ingest.scrape.exposition import ExpositionError, parse
from monitor.ingest.scrape.targets import ScrapeTarget
from monitor.store.scrape import ScrapeIntervalRow, ScrapeTargetRow
from monitor.store.types import Fence

log = logging.getLogger(__name__)

# A target is due a little before its interval has passed, so that a job tick's jitter never skips one.
SLACK: Final = timedelta(seconds=1)
MAX_BODY: Final = 8 * 1024 * 1024


@dataclass(slots=True)
class ScrapeReport:
    scraped: int = 0
    intervals: int = 0
    failed: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Outcome:
    readings: dict[str | None, Reading] | None
    status: str
    error: str | None = None


def scrape_due(
    engine: Engine,
    targets: Sequence[ScrapeTarget],
    now: datetime | None = None,
    *,
    client: httpx.Client | None = None,
    fence: Fence | None = None,
) -> ScrapeReport:
    """Scrape the targets that are due at ``now``; returns what was done."""
    now = (now or datetime.now(UTC)).astimezone(UTC)
    report = ScrapeReport()
    if not targets:
        return report
    with engine.connect() as conn:
        rows = {r.name: r for r in conn.execute(select(ScrapeTargetRow.__table__))}
    due = [(t, row) for t in targets if (row := rows.get(t.name)) is None or now - row.scraped_at >= t.interval - SLACK]
    if not due:  # no client made for nothing (see monitor/notify/delivery.py: its cost to the event loop)
        return report
    http = client or httpx.Client(follow_redirects=False)
    try:
        for target, row in due:
            outcome = fetch(http, target)
            with engine.begin() as conn:
                report.intervals += _store(conn, target, row, outcome, now)
                if fence is not None:
                    fence(conn)
            report.scraped += 1
            if outcome.error is not None:
                report.failed[target.name] = outcome.error
                log.warning("scrape %s (%s): %s", target.name, target.safe_url, outcome.error)
    finally:
        if client is None:
            http.close()
    return report


def fetch(http: httpx.Client, target: ScrapeTarget) -> Outcome:
    """Read one target's exposition; what went wrong says why without quoting the body."""
    try:
        # Never followed: a redirect elsewhere would take the target's credential with it.
        response = http.get(target.url, timeout=target.timeout_s, headers=target.headers, follow_redirects=False)
    except httpx.TimeoutException:
        return Outcome(None, "down", f"no answer within {target.timeout_s:g} s")
    except httpx.HTTPError as error:
        return Outcome(None, "down", f"unreachable ({type(error).__name__})")
    if response.status_code != 200:
        return Outcome(None, "down", f"HTTP {response.status_code}")
    if len(response.content) > MAX_BODY:
        return Outcome(None, "garbage", f"body over {MAX_BODY} bytes")
    try:
        return Outcome(read(target.kind, parse(response.text)), "up")
    except (ExpositionError, EngineError) as error:
        return Outcome(None, "garbage", str(error)[:300])


def _key(model: str | None) -> str:
    return model or ""


def _store(conn: Connection, target: ScrapeTarget, row: Row[Any] | None, outcome: Outcome, now: datetime) -> int:
    previous: dict[str, Any] = dict(row.counters) if row is not None else {}
    stored = 0
    values: list[dict[str, Any]] = []
    if outcome.readings is not None:
        since = row.up_at if row is not None else None
        for model, reading in outcome.readings.items():
            before = previous.get(_key(model))
            if since is not None and before is not None:
                values.append(_interval_row(target, reading, before, since, now))
        if values:
            conn.execute(insert(ScrapeIntervalRow), values)
            stored = len(values)
        previous = {
            _key(m): {"counters": r.counters, "per_position": {str(p): v for p, v in r.per_position.items()}}
            for m, r in outcome.readings.items()
        }
    state = {
        "kind": target.kind,
        "status": outcome.status,
        "error": outcome.error,
        "failures": 0 if outcome.error is None else (row.failures if row is not None else 0) + 1,
        "resets": (row.resets if row is not None else 0) + sum(bool(v.get("reset")) for v in values),
        "reset_at": now if any(v.get("reset") for v in values) else (row.reset_at if row is not None else None),
        "scraped_at": now,
        "up_at": now if outcome.error is None else (row.up_at if row is not None else None),
        "counters": previous,
    }
    if row is None:
        conn.execute(insert(ScrapeTargetRow).values(name=target.name, **state))
    else:
        conn.execute(update(ScrapeTargetRow).where(ScrapeTargetRow.name == target.name).values(**state))
    return stored


def _interval_row(
    target: ScrapeTarget, reading: Reading, before: dict[str, Any], since: datetime, now: datetime
) -> dict[str, Any]:
    base = {
        "target": target.name,
        "kind": target.kind,
        "workload": target.workload,
        "target_model": target.target_model or reading.model or target.name,
        "drafter": target.drafter,
        "started_at": since,
        "ended_at": now,
    }
    if target.kind == "sglang":
        return {**base, "accept_rate": reading.accept_rate, "accept_length": reading.accept_length, "reset": False}
    old_positions = {int(p): v for p, v in before.get("per_position", {}).items()}
    counted = interval(before.get("counters", {}), old_positions, reading.counters, reading.per_position)
    return {
        **base,
        "drafts": counted.drafts,
        "draft_tokens": counted.draft_tokens,
        "accepted_tokens": counted.accepted_tokens,
        "accepted_per_position": counted.per_position,
        "reset": counted.reset,
    }
