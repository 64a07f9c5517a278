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
from typing import Any, Final, NamedTuple

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
    # Why the figure moved, in words (the acceptance split's sentence); leads the alert's description.
    explanation: str | None = None
    # What happened, in its user's words (a rollout's transition): the alert's summary in place of the rule's, its
    # description the note alone, without the test's decision and effect.
    title: str | None = None


@dataclass(slots=True)
class Evaluation:
    """What one evaluation did: transitions per alert id and notifications written."""

    transitions: dict[int, str] = field(default_factory=dict)
    notified: list[tuple[int, str]] = field(default_factory=list)
    outbox_rows: int = 0


@dataclass(slots=True)
class _Found:
    """What this evaluation found for one alert: the rule that matched, its labels, each signal and its verdict."""

    rule: Rule
    labels: dict[str, str]
    verdicts: list[bool | None] = field(default_factory=list)
    signals: list[Signal] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Pass:
    """What every alert of one evaluation shares: the transaction, the config, the silences, the clock, the report."""

    conn: Connection
    config: AlertConfig
    silences: Sequence[Silence]
    now: datetime
    report: Evaluation


@dataclass(frozen=True, slots=True)
class _Target:
    """One alert under evaluation: its identity, its stored row (None: new) and what was found (None: nothing)."""

    fp: str
    rule: Rule
    row: Any
    found: _Found | None


class _Shown(NamedTuple):
    """What an alert shows receivers and the API: labels, annotations, value."""

    labels: dict[str, str]
    annotations: dict[str, str]
    value: float | None


def signals_from_results(results: Iterable[Any]) -> list[Signal]:
    """Drift signals from result objects of any shape carrying the drift result attributes."""
    out = []
    for item in results:
        r = getattr(item, "result", item)
        labels = {k: str(v) for k in ("workload", "pair", "metric") if (v := getattr(r, k, None)) not in (None, "")}
        effect = getattr(r, "effect", None)
        explanation = (getattr(r, "detail", None) or {}).get("explanation")
        note = getattr(r, "note", None)
        out.append(Signal("drift", str(r.test), str(r.decision), labels, effect, note, explanation))
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
    verdicts: dict[str, _Found] = {}
    for signal in signals:
        for candidate in config.alerts.rules:
            if candidate.applies(source, signal.test, signal.labels.get("metric")):
                fp = fingerprint(candidate.name, signal.labels)
                entry = verdicts.setdefault(fp, _Found(candidate, signal.labels))
                entry.verdicts.append(candidate.verdict(signal.decision, signal.effect))
                entry.signals.append(signal)
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
        run = _Pass(conn, config, active_silences(conn, now), now, report)
        notices: list[AlertView] = []
        states: list[AlertView] = []
        for fp in sorted(set(verdicts) | {f for f, r in rows.items() if r.state == "firing"}):
            row = rows.get(fp)
            rule = rules.get(row.rule if row is not None else verdicts[fp].rule.name)
            if rule is None or not rule.enabled:
                continue  # a rule removed from the config: its alerts stay as they are
            notice, state = _evaluate_one(run, _Target(fp, rule, row, verdicts.get(fp)))
            notices += [notice] if notice is not None else []
            states += [state] if state is not None else []
        args = (config.receivers, config.alerts.group_by, config.external_url, now)
        report.outbox_rows = write_notifications(conn, notices, states, *args)
        if fence is not None:
            fence(conn)
    if report.transitions or report.notified:
        log.info("alerts (%s): transitions %s, notified %s", source, report.transitions, report.notified)
    return report


def _evaluate_one(run: _Pass, target: _Target) -> tuple[AlertView | None, AlertView | None]:
    """Step one alert, save it, and return the notice for webhooks (None: nothing to tell) and its state
    for receivers that mirror state (None unless it fires, or resolved in this evaluation)."""
    rule, row, found = target.rule, target.row, target.found
    cfg = run.config.alerts.state_config(rule)
    alert = _state_of(row)
    transition = None
    if found is not None:
        verdicts = found.verdicts
        active = True if any(verdicts) else (False if any(v is False for v in verdicts) else None)
        transition = step(alert, active, cfg, run.now)
    if row is None and alert.state == "inactive":
        return None, None  # never active: no row for it
    if row is not None:
        labels = {**row.labels, "severity": rule.severity}
    else:
        labels = {"alertname": rule.name, "severity": rule.severity, **(found.labels if found else {})}
    notify = decide(alert, transition, cfg, run.now, is_silenced(run.silences, labels))
    if found is not None and (row is None or any(found.verdicts)):
        # Annotations describe the evidence that made the alert active; a clearing run keeps them.
        shown = _Shown(labels, *_annotations(rule, found.signals))
    else:
        shown = _Shown(labels, row.annotations, row.value) if row is not None else _Shown(labels, {}, None)
    alert_id = _save(run, target, alert, shown)
    if transition is not None:
        run.report.transitions[alert_id] = transition
    if notify is not None:
        run.report.notified.append((alert_id, notify))
    start = alert.fired_at or alert.pending_since or run.now

    def view(status: str | None) -> AlertView | None:
        if status is None:
            return None
        end = alert.resolved_at if status == "resolved" else None
        labels, annotations, value = shown
        return AlertView(alert_id, target.fp, rule.name, rule.severity, status, labels, annotations, start, end, value)

    state = "firing" if alert.state == "firing" else "resolved" if transition == "resolved" else None
    return view(notify), view(state)


def _state_of(row: Any) -> AlertState:
    if row is None:
        return AlertState()
    return AlertState(**{name: getattr(row, name) for name in _STATE_FIELDS})


def _annotations(rule: Rule, signals: Sequence[Signal]) -> tuple[dict[str, str], float | None]:
    keys = ("deployment", "step", "workload", "pair")
    where = ", ".join(f"{k} {signals[0].labels[k]}" for k in keys if k in signals[0].labels)
    parts = []
    value = None
    for s in signals:
        effect = f"effect {s.effect:+.4g}" if s.effect is not None else "no effect size"
        parts.append(f"{s.test}: {s.decision}, {effect}" + (f" ({s.note})" if s.note else ""))
        if s.decision == "drift" and s.effect is not None:
            value = float(s.effect)
    titles = dict.fromkeys(s.title for s in signals if s.title)
    if titles:  # the event in words: its title and its note say what happened
        notes = dict.fromkeys(s.note for s in signals if s.title and s.note)
        return {"summary": "; ".join(titles), "description": "; ".join(notes)}, value
    summary = rule.summary + (f" ({where})" if where else "")
    said = next((s.explanation for s in signals if s.explanation), None)
    description = "; ".join(parts)
    return {"summary": summary, "description": f"{said} {description}" if said else description}, value


def _save(run: _Pass, target: _Target, alert: AlertState, shown: _Shown) -> int:
    now, rule, row = run.now, target.rule, target.row
    values: dict[str, Any] = {name: getattr(alert, name) for name in _STATE_FIELDS}
    values |= {"severity": rule.severity, **shown._asdict()}
    values |= {"updated_at": now} | ({"last_eval_at": now} if target.found is not None else {})
    if row is None:
        values |= {"fingerprint": target.fp, "rule": rule.name, "created_at": now, "last_eval_at": now}
        return int(run.conn.execute(insert(AlertRow).values(**values).returning(AlertRow.id)).scalar_one())
    run.conn.execute(update(AlertRow).where(AlertRow.id == row.id).values(**values))
    return int(row.id)


def stale_cutoff(now: datetime, interval: timedelta, factor: int = 3) -> datetime:
    """The time before which a periodic job's last success counts as stale (``factor`` intervals)."""
    return now - interval * factor
