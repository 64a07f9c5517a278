"""Evaluating the rules: signals in, alert rows changed and outbox rows written, in one transaction.

:func:`evaluate_alerts` takes the results of a drift run (any objects with ``test``, ``workload``,
``pair``, ``metric``, ``decision`` and ``effect`` attributes: :class:`monitor.drift.result.DriftResult`,
stored rows, or wrappers with a ``result``), :func:`monitor.scheduler.health.evaluate_health` takes
health signals; both end in :func:`evaluate_signals`. Evaluations are serialised (a transaction-level
advisory lock on PostgreSQL, an immediate write lock on SQLite) so that a CLI run and the scheduler
never double-insert an alert, and a ``fence`` callback (the scheduler's lease check) runs just before
commit: a replica that lost its lease rolls the whole evaluation back.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from sqlalchemy import insert, select, text, update
from sqlalchemy.engine import Connection, Engine

from monitor.alerts.models import AlertRow
from monitor.alerts.rules import Rule
from monitor.alerts.settings import AlertConfig
from monitor.alerts.silences import Silence, active_silences, is_silenced
from monitor.alerts.state import AlertState, decide, step
from monitor.notify.formats import AlertView
from monitor.notify.outbox import write_notifications
from monitor.store.types import Fence

log = logging.getLogger(__name__)

# Any fixed 64-bit number distinct from the migration lock's ("DWALERTS" in ASCII).
EVALUATION_LOCK_KEY: Final = 0x4457414C45525453
LABEL_KEYS: Final = ("workload", "pair", "metric", "job", "host")
_STATE_FIELDS: Final = tuple(AlertState.__dataclass_fields__)
ALERTS: Final = AlertRow.__table__


@dataclass(frozen=True, slots=True)
class Signal:
    """One observation a rule may turn into an alert: a drift result or a health check."""

    source: str
    test: str
    decision: str
    labels: dict[str, str]
    effect: float | None = None
    note: str | None = None


@dataclass(slots=True)
class Evaluation:
    """What one evaluation did: transitions per alert id and notifications written."""

    transitions: dict[int, str] = field(default_factory=dict)
    notified: list[tuple[int, str]] = field(default_factory=list)
    outbox_rows: int = 0


def signals_from_results(results: Iterable[Any]) -> list[Signal]:
    """Drift signals from result objects of any shape carrying the drift result attributes."""
    out = []
    for item in results:
        r = getattr(item, "result", item)
        labels = {k: str(v) for k in ("workload", "pair", "metric") if (v := getattr(r, k, None)) not in (None, "")}
        effect = getattr(r, "effect", None)
        out.append(Signal("drift", str(r.test), str(r.decision), labels, effect, getattr(r, "note", None)))
    return out


def fingerprint(rule: str, labels: dict[str, str]) -> str:
    """Stable identity of an alert: rule name plus its labels (severity excluded), 16 hex digits."""
    blob = json.dumps([rule, sorted(labels.items())], separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def lock_evaluation(conn: Connection) -> None:
    """Serialise evaluations for the rest of ``conn``'s transaction."""
    if conn.dialect.name == "postgresql":
        conn.execute(select(text(f"pg_advisory_xact_lock({EVALUATION_LOCK_KEY})")))
    else:
        # A write statement takes SQLite's write lock at once, so this transaction never has to
        # upgrade a read snapshot later (which fails when another writer got in between).
        conn.execute(text("UPDATE alerts SET id = id WHERE 1 = 0"))


def evaluate_alerts(
    engine: Engine,
    config: AlertConfig,
    results: Iterable[Any],
    *,
    now: datetime | None = None,
    fence: Fence | None = None,
) -> Evaluation:
    """Evaluate the drift rules over one drift run's results (see the module docstring)."""
    return evaluate_signals(engine, config, "drift", signals_from_results(results), now=now, fence=fence)


def evaluate_signals(
    engine: Engine,
    config: AlertConfig,
    source: str,
    signals: Sequence[Signal],
    *,
    now: datetime | None = None,
    fence: Fence | None = None,
) -> Evaluation:
    """Apply the ``source`` rules to ``signals``, reconcile notifications of every firing alert, write the outbox."""
    now = (now or datetime.now(UTC)).astimezone(UTC)
    verdicts: dict[str, tuple[Rule, dict[str, str], list[bool | None], list[Signal]]] = {}
    for signal in signals:
        for candidate in config.alerts.rules:
            if candidate.applies(source, signal.test, signal.labels.get("metric")):
                fp = fingerprint(candidate.name, signal.labels)
                entry = verdicts.setdefault(fp, (candidate, signal.labels, [], []))
                entry[2].append(candidate.verdict(signal.decision, signal.effect))
                entry[3].append(signal)
    rules = {r.name: r for r in config.alerts.rules}
    report = Evaluation()
    with engine.begin() as conn:
        lock_evaluation(conn)
        live = select(ALERTS).where(ALERTS.c.state.in_(("pending", "firing")))
        rows: dict[str, Any] = {r.fingerprint: r for r in conn.execute(live)}
        if verdicts:
            extra = set(verdicts) - set(rows)
            query = select(ALERTS).where(ALERTS.c.fingerprint.in_(sorted(extra)))
            rows |= {r.fingerprint: r for r in conn.execute(query)} if extra else {}
        silences = active_silences(conn, now)
        notices: list[AlertView] = []
        states: list[AlertView] = []
        for fp in sorted(set(verdicts) | {f for f, r in rows.items() if r.state == "firing"}):
            row = rows.get(fp)
            rule = rules.get(row.rule if row is not None else verdicts[fp][0].name)
            if rule is None or not rule.enabled:
                continue  # a rule removed from the config: its alerts stay as they are
            found = verdicts.get(fp)
            notice, state = _evaluate_one(conn, config, rule, fp, row, found, silences, now, report)
            notices += [notice] if notice is not None else []
            states += [state] if state is not None else []
        args = (config.receivers, config.alerts.group_by, config.external_url, now)
        report.outbox_rows = write_notifications(conn, notices, states, *args)
        if fence is not None:
            fence(conn)
    if report.transitions or report.notified:
        log.info("alerts (%s): transitions %s, notified %s", source, report.transitions, report.notified)
    return report


def _evaluate_one(
    conn: Connection,
    config: AlertConfig,
    rule: Rule,
    fp: str,
    row: Any,
    found: tuple[Rule, dict[str, str], list[bool | None], list[Signal]] | None,
    silences: Sequence[Silence],
    now: datetime,
    report: Evaluation,
) -> tuple[AlertView | None, AlertView | None]:
    """Step one alert, save it, and return the notice for webhooks (None: nothing to tell) and its state
    for receivers that mirror state (None unless it fires, or resolved in this evaluation)."""
    cfg = config.alerts.state_config(rule)
    alert = _state_of(row)
    transition = None
    if found is not None:
        verdicts = found[2]
        active = True if any(verdicts) else (False if any(v is False for v in verdicts) else None)
        transition = step(alert, active, cfg, now)
    if row is None and alert.state == "inactive":
        return None, None  # never active: no row for it
    if row is not None:
        labels = {**row.labels, "severity": rule.severity}
    else:
        labels = {"alertname": rule.name, "severity": rule.severity, **(found[1] if found else {})}
    notify = decide(alert, transition, cfg, now, is_silenced(silences, labels))
    if found is not None and (row is None or any(found[2])):
        # Annotations describe the evidence that made the alert active; a clearing run keeps them.
        annotations, value = _annotations(rule, found[3])
    else:
        annotations, value = (row.annotations, row.value) if row is not None else ({}, None)
    alert_id = _save(conn, row, fp, rule, labels, annotations, value, alert, now, found is not None)
    if transition is not None:
        report.transitions[alert_id] = transition
    if notify is not None:
        report.notified.append((alert_id, notify))
    start = alert.fired_at or alert.pending_since or now

    def view(status: str | None) -> AlertView | None:
        if status is None:
            return None
        end = alert.resolved_at if status == "resolved" else None
        return AlertView(alert_id, fp, rule.name, rule.severity, status, labels, annotations, start, end, value)

    state = "firing" if alert.state == "firing" else "resolved" if transition == "resolved" else None
    return view(notify), view(state)


def _state_of(row: Any) -> AlertState:
    if row is None:
        return AlertState()
    return AlertState(**{name: getattr(row, name) for name in _STATE_FIELDS})


def _annotations(rule: Rule, signals: Sequence[Signal]) -> tuple[dict[str, str], float | None]:
    where = ", ".join(f"{k} {signals[0].labels[k]}" for k in ("workload", "pair") if k in signals[0].labels)
    parts = []
    value = None
    for s in signals:
        effect = f"effect {s.effect:+.4g}" if s.effect is not None else "no effect size"
        parts.append(f"{s.test}: {s.decision}, {effect}" + (f" ({s.note})" if s.note else ""))
        if s.decision == "drift" and s.effect is not None:
            value = float(s.effect)
    summary = rule.summary + (f" ({where})" if where else "")
    return {"summary": summary, "description": "; ".join(parts)}, value


def _save(
    conn: Connection,
    row: Any,
    fp: str,
    rule: Rule,
    labels: dict[str, str],
    annotations: dict[str, str],
    value: float | None,
    alert: AlertState,
    now: datetime,
    evaluated: bool,
) -> int:
    values: dict[str, Any] = {name: getattr(alert, name) for name in _STATE_FIELDS}
    values |= {"severity": rule.severity, "labels": labels, "annotations": annotations, "value": value}
    values |= {"updated_at": now} | ({"last_eval_at": now} if evaluated else {})
    if row is None:
        values |= {"fingerprint": fp, "rule": rule.name, "created_at": now, "last_eval_at": now}
        return int(conn.execute(insert(AlertRow).values(**values).returning(AlertRow.id)).scalar_one())
    conn.execute(update(AlertRow).where(AlertRow.id == row.id).values(**values))
    return int(row.id)


def stale_cutoff(now: datetime, interval: timedelta, factor: int = 3) -> datetime:
    """The time before which a periodic job's last success counts as stale (``factor`` intervals)."""
    return now - interval * factor
