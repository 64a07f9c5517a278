"""What ``/metrics`` reads from the database: the signals the built-in alert rules judge, and the alerts' states.

* ``draftwatch_drift_decision{workload, pair, test, metric, decision}``: the newest drift run's
  results, one series per decision (``drift``, ``no_drift``, ``insufficient_data``), 1 for the
  result's own; ``draftwatch_drift_effect`` their effects (NaN where a test has none) and
  ``draftwatch_drift_last_run_timestamp_seconds`` when that run finished.
* ``draftwatch_health_signal{check, scheduler_job, host}``: the health checks the scheduler's
  ``health`` job judges (:func:`monitor.scheduler.health.health_signals`), 1 when active. The job
  label is ``scheduler_job``: Prometheus keeps ``job`` for its scrape job.
* ``draftwatch_alerts{alertname, severity, state}``: pending and firing alerts per rule, zero for
  every enabled rule.
* ``draftwatch_scrape_target_up{scrape_target}`` (1: its last scrape succeeded) and
  ``draftwatch_scraped_acceptance_rate{workload, target, drafter, scrape_target}``: scrape mode's
  targets and the acceptance of their series over the last ``drift.current_window`` (accepted /
  drafted tokens; SGLang's gauge averaged), so that panels and rules see scraped engines too.
* ``draftwatch_speculation_speedup{workload, pair}`` and ``draftwatch_speculation_verdict{workload,
  pair, verdict}``: the newest drift run's net-loss verdict (:mod:`monitor.drift.verdict`).

These are the same for every replica of one database, so rules take ``max`` over them
(docs/prometheus/draftwatch-rules.yml). A scrape never waits long on the database: the figures are
read at most every :data:`MAX_AGE_S`, on a thread of their own, and a scrape waits :data:`WAIT_S`
for a read it started before it takes the last figures read. When a read fails, the last figures
stay (``draftwatch_recorder_database_available`` says why).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from sqlalchemy.engine import Engine

from monitor.alerts.evaluate import Signal
from monitor.alerts.queries import AlertItem, list_alerts
from monitor.api.metrics import MAX_LABEL_SETS, Family, Labels
from monitor.config import Settings
from monitor.drift.queries import StoredResult, latest_results, latest_run
from monitor.drift.result import DECISIONS
from monitor.drift.verdict import VERDICTS, verdict_of
from monitor.log_safe import describe
from monitor.scheduler.health import health_signals
from monitor.store.scrape import ScrapedSummary, TargetHealth, scraped_summaries, target_health

log = logging.getLogger(__name__)

MAX_AGE_S: Final = 5.0
WAIT_S: Final = 0.25
ALERT_STATES: Final = ("pending", "firing")
# An alert row per fingerprint: far fewer pending or firing ones than this in any real database.
MAX_ALERT_ROWS: Final = 10_000
_SIGNAL_LABELS: Final = {"job": "scheduler_job", "host": "host"}


@dataclass(frozen=True, slots=True)
class Read:
    """One read of the database's figures."""

    finished_at: datetime | None  # of the newest drift run
    results: Sequence[StoredResult]
    health: Sequence[Signal]
    alerts: Sequence[AlertItem]
    scraped: Sequence[ScrapedSummary] = ()
    targets: Sequence[TargetHealth] = ()


def families(read: Read | None, settings: Settings) -> list[Family]:
    """The families of one read (``None``: nothing read yet, so HELP, TYPE and the alerts' zeros only)."""
    decisions: list[tuple[Labels, float]] = []
    effects: list[tuple[Labels, float]] = []
    keys: set[tuple[str | None, str | None]] = set()
    for stored in read.results if read else ():
        r = stored.result
        if (r.workload, r.pair) not in keys and len(keys) >= MAX_LABEL_SETS:
            continue  # GET /v1/drift has them all
        keys.add((r.workload, r.pair))
        named = (("workload", r.workload), ("pair", r.pair), ("test", r.test), ("metric", r.metric))
        labels = tuple((k, v) for k, v in named if v)
        decisions += [((*labels, ("decision", d)), float(d == r.decision)) for d in DECISIONS]
        effects.append((labels, math.nan if r.effect is None else r.effect))
    finished = [((), read.finished_at.timestamp())] if read and read.finished_at else []
    speedups, verdicts = _verdict_samples(read)
    health = [_health_sample(signal) for signal in (read.health if read else ())]
    return [
        Family(
            "draftwatch_drift_decision", "Decisions of the newest drift run, 1 for the one taken.", "gauge", decisions
        ),
        Family("draftwatch_drift_effect", "Effects of the newest drift run's tests (NaN: none).", "gauge", effects),
        Family("draftwatch_drift_last_run_timestamp_seconds", "When the newest drift run finished.", "gauge", finished),
        Family("draftwatch_health_signal", "The scheduler's health checks, 1 when active.", "gauge", health),
        Family(
            "draftwatch_speculation_speedup",
            "Measured decode speedup of speculation over plain decoding per workload and pair (newest drift run; "
            "NaN: not measured).",
            "gauge",
            speedups,
        ),
        Family(
            "draftwatch_speculation_verdict",
            "Is speculation paying, per workload and pair: 1 for the verdict taken (pays, net_loss, inconclusive, "
            "not_measured).",
            "gauge",
            verdicts,
        ),
        Family("draftwatch_alerts", "Pending and firing alerts per rule.", "gauge", _alert_counts(read, settings)),
        Family(
            "draftwatch_scrape_target_up",
            "Scrape mode: 1 when a target's last scrape succeeded.",
            "gauge",
            [((("scrape_target", t.name),), float(t.status == "up")) for t in (read.targets if read else ())],
        ),
        Family(
            "draftwatch_scraped_acceptance_rate",
            "Scrape mode: acceptance of a target's series over the drift window (aggregate, per interval).",
            "gauge",
            [_scraped_sample(s) for s in (read.scraped if read else ())[:MAX_LABEL_SETS]],
        ),
    ]


def _verdict_samples(read: Read | None) -> tuple[list[tuple[Labels, float]], list[tuple[Labels, float]]]:
    speedups: list[tuple[Labels, float]] = []
    verdicts: list[tuple[Labels, float]] = []
    for stored in read.results if read else ():
        if stored.result.test != "net_loss" or len(speedups) >= MAX_LABEL_SETS:
            continue
        v = verdict_of(stored.result)
        labels: Labels = (("workload", v.workload), ("pair", v.pair or ""))
        speedups.append((labels, math.nan if v.speedup is None else v.speedup))
        verdicts += [((*labels, ("verdict", name)), float(name == v.verdict)) for name in VERDICTS]
    return speedups, verdicts


def _scraped_sample(summary: ScrapedSummary) -> tuple[Labels, float]:
    named = (("workload", summary.workload), ("target", summary.target_model), ("drafter", summary.drafter))
    rate = summary.acceptance_rate if summary.acceptance_rate is not None else summary.accept_rate_gauge
    return (*named, ("scrape_target", summary.target)), math.nan if rate is None else rate


def _health_sample(signal: Signal) -> tuple[Labels, float]:
    labels = tuple((_SIGNAL_LABELS.get(k, k), v) for k, v in sorted(signal.labels.items()))
    return (("check", signal.test), *labels), float(signal.decision == "drift")


def _alert_counts(read: Read | None, settings: Settings) -> list[tuple[Labels, float]]:
    counts: dict[Labels, float] = {
        (("alertname", rule.name), ("severity", rule.severity), ("state", state)): 0.0
        for rule in settings.alerts.rules
        if rule.enabled
        for state in ALERT_STATES
    }
    for alert in read.alerts if read else ():
        labels = (("alertname", alert.rule), ("severity", alert.severity), ("state", alert.state))
        counts[labels] = counts.get(labels, 0.0) + 1
    return sorted(counts.items())


def read_figures(engine: Engine, settings: Settings) -> Read:
    run = latest_run(engine)
    now = datetime.now(UTC)
    return Read(
        finished_at=run.finished_at if run else None,
        results=latest_results(engine, run_id=run.run_id) if run else [],
        health=health_signals(engine, settings, now),
        alerts=list_alerts(engine, ALERT_STATES, limit=MAX_ALERT_ROWS),
        scraped=scraped_summaries(engine, now - settings.drift.current_window, now),
        targets=target_health(engine),
    )


class StoreFigures:
    """The ``/metrics`` collector of the database's figures: ``metrics.add_families(StoreFigures(...).collect)``."""

    def __init__(self, engine: Engine, settings: Settings) -> None:
        self._engine, self._settings = engine, settings
        self._lock = threading.Lock()
        self._families = families(None, settings)
        self._read_at = -math.inf
        self._reading: threading.Thread | None = None
        self._failing = False

    def collect(self) -> list[Family]:
        with self._lock:
            if self._reading is None and time.monotonic() - self._read_at >= MAX_AGE_S:
                self._reading = threading.Thread(target=self._read, name="metrics-store-read", daemon=True)
                self._reading.start()
            reading = self._reading
        if reading is not None:
            reading.join(WAIT_S)
        return self._families

    def _read(self) -> None:
        try:
            self._families = families(read_figures(self._engine, self._settings), self._settings)
            if self._failing:
                log.info("metrics: the database's figures are read again")
            self._failing = False
        except Exception as error:  # the last figures stay; the next scrape after MAX_AGE_S tries again
            if not self._failing:
                log.warning("metrics: reading the database's figures failed (%s)", describe(error))
            self._failing = True
        finally:
            with self._lock:
                self._read_at = time.monotonic()
                self._reading = None
