"""``GET /metrics``: the Prometheus text exposition of this sidecar; the route and every figure it renders.

Three kinds of figure, in exposition order:

**Recorded by this process** (:class:`Metrics`), with names parallel to vLLM's ``spec_decode_*``.
Counters are per process and count records when this process made them durable (committed or
fsync'd to the spool), ingested or decoded alike; Prometheus sums replicas. A record re-sent with a
known ``request_id`` is stored once and counted once; only one that arrives while the database is
down, and is therefore spooled before the store can tell, is counted again.

Every record family is labelled by ``workload``, ``target`` and ``drafter`` (the second half of the
drift results' ``pair``: ``model:qwen-coder-0.5b``, ``ngram``), and by ``mode`` where a request's mode
applies (requests, errors, tokens, latencies; drafts happen only in speculative mode). A label set
seen for the first time gets zero samples in every family, for every mode, so ``rate()`` and ratios
work from the first scrape. Label sets are bounded: after :data:`MAX_LABEL_SETS` distinct
``(workload, target, drafter)`` sets, further ones are counted under ``_other`` in all three (a name no
workload tag can take), and per-position counts beyond :data:`MAX_POSITIONS` under ``position="_other"``,
so a hostile client cannot blow up the series count.

**This process's state** (:func:`own_figures`), read at every scrape: the recorder's queue, totals
and database, the proxy's unrecorded responses, the prompt sample's counts, the decode queue; in
proxy mode also each replica's ``draftwatch_proxy_upstream_up{upstream, pool}`` (:func:`upstreams_up`).

**The database's figures** (:class:`StoreFigures`): the signals the built-in alert rules judge, and
the alerts' states.

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
* ``draftwatch_rollout_step`` and ``draftwatch_rollout_share{deployment, drafter, rollout}``: each
  active drafter rollout's step (1-based) and the share of the deployment's speculative traffic its
  candidate serves (:mod:`monitor.proxy.rollout`); per workload of its newest judgement,
  ``draftwatch_rollout_score{deployment, drafter, rollout, workload}`` (0-100, NaN: unjudged) and
  ``draftwatch_rollout_decode_speed_ratio`` (the current drafter's ms per token over the
  candidate's, above 1: the candidate is faster; NaN: not measured).

These are the same for every replica of one database, so rules take ``max`` over them
(docs/prometheus/draftwatch-rules.yml). A scrape never waits long on the database: the figures are
read at most every :data:`MAX_AGE_S`, on a thread of their own, and a scrape waits :data:`WAIT_S`
for a read it started before it takes the last figures read. When a read fails, the last figures
stay (``draftwatch_recorder_database_available`` says why).

>>> m = Metrics(); from monitor.ingest.synthetic import synthetic_record
>>> m.observe([synthetic_record(1, workload="code")], "written")
>>> for line in m.render().splitlines():
...     if line.startswith("draftwatch_requests_total{"):
...         print(line)
draftwatch_requests_total{workload="code",target="qwen-coder-1.5b",drafter="model:qwen-coder-0.5b",mode="holdout"} 0
draftwatch_requests_total{workload="code",target="qwen-coder-1.5b",drafter="model:qwen-coder-0.5b",mode="plain"} 0
draftwatch_requests_total{workload="code",target="qwen-coder-1.5b",drafter="model:qwen-coder-0.5b",mode="speculative"} 1
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

import anyio.to_thread
import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from sqlalchemy.engine import Engine

from decoder.record import MODES, RequestRecord
from monitor.alerts.evaluate import Signal
from monitor.alerts.queries import AlertItem, list_alerts
from monitor.api.auth import GuardedRoute
from monitor.api.reads import workloads
from monitor.api.state import ApiState, api_state
from monitor.config import Settings
from monitor.drift.detectors.ledger_rates import LedgerRates, newest_ledger_rates
from monitor.drift.detectors.net_loss import load_level
from monitor.drift.queries import StoredResult, latest_results, latest_run
from monitor.drift.result import DECISIONS
from monitor.drift.verdict import VERDICTS, verdict_of
from monitor.log_safe import describe
from monitor.scheduler.health import health_signals
from monitor.store.reads.results import Pair
from monitor.store.rollouts import Rollout, active_rollouts
from monitor.store.scrape import ScrapedSummary, TargetHealth, scraped_summaries, target_health

if TYPE_CHECKING:
    from monitor.proxy.routing import Router

log = logging.getLogger(__name__)
router = APIRouter(tags=["read"], route_class=GuardedRoute)

MAX_LABEL_SETS: Final = 200
MAX_POSITIONS: Final = 32
OTHER: Final = "_other"
TPOT_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0)
TTFT_BUCKETS: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)

Labels = tuple[tuple[str, str], ...]
OTHER_KEY: Final[Labels] = (("workload", OTHER), ("target", OTHER), ("drafter", OTHER))

REQUESTS: Final = "draftwatch_requests_total"
ERRORS: Final = "draftwatch_request_errors_total"
PROMPT_TOKENS: Final = "draftwatch_prompt_tokens_total"
GENERATION_TOKENS: Final = "draftwatch_generation_tokens_total"
DRAFTS: Final = "draftwatch_spec_decode_num_drafts_total"
DRAFT_TOKENS: Final = "draftwatch_spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS: Final = "draftwatch_spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS: Final = "draftwatch_spec_decode_num_accepted_tokens_per_pos_total"
TPOT: Final = "draftwatch_request_time_per_output_token_seconds"
TTFT: Final = "draftwatch_time_to_first_token_seconds"


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family as exposed; without samples it still says HELP and TYPE."""

    name: str
    help: str
    kind: str  # counter or gauge
    samples: Sequence[tuple[Labels, float]] = ()


@dataclass(frozen=True, slots=True)
class _Spec:
    name: str
    help: str
    by_mode: bool = False
    buckets: tuple[float, ...] = ()  # a histogram when given


# Every family fed by records, in exposition order.
RECORD_FAMILIES: Final = (
    _Spec(REQUESTS, "Finished requests recorded.", by_mode=True),
    _Spec(ERRORS, "Recorded requests that finished with an error.", by_mode=True),
    _Spec(PROMPT_TOKENS, "Prompt tokens of recorded requests.", by_mode=True),
    _Spec(GENERATION_TOKENS, "Output tokens of recorded requests.", by_mode=True),
    _Spec(DRAFTS, "Verification steps (vLLM: spec_decode_num_drafts)."),
    _Spec(DRAFT_TOKENS, "Draft tokens proposed."),
    _Spec(ACCEPTED_TOKENS, "Draft tokens accepted."),
    _Spec(ACCEPTED_PER_POS, "Steps whose draft token at position (0-based) was accepted."),
    _Spec(
        TPOT,
        "A request's decode time per output token after the first (vLLM's request_time_per_output_token).",
        by_mode=True,
        buckets=TPOT_BUCKETS,
    ),
    _Spec(TTFT, "Time to first token.", by_mode=True, buckets=TTFT_BUCKETS),
)


class _Histogram:
    __slots__ = ("buckets", "count", "counts", "total")

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        index = bisect.bisect_left(self.buckets, value)
        if index < len(self.counts):
            self.counts[index] += 1
        self.count += 1
        self.total += value


class Metrics:
    """Thread-safe counters and histograms; :meth:`observe` is the recorder's ``on_durable`` hook."""

    def __init__(self, version: str = "0.0.0") -> None:
        self._lock = threading.Lock()
        self._version = version
        self._counters: dict[str, dict[Labels, float]] = {s.name: {} for s in RECORD_FAMILIES if not s.buckets}
        self._histograms: dict[str, dict[Labels, _Histogram]] = {s.name: {} for s in RECORD_FAMILIES if s.buckets}
        self._keys: set[Labels] = set()  # at most MAX_LABEL_SETS, plus OTHER_KEY
        # Per record's (workload, target, drafter, draft model): its label set, made once (the recorder's batch
        # counts in a thread that takes the GIL from the proxy's event loop: every microsecond a record is its
        # latency). Per label set: its positions' labels, and how many of them have a sample already.
        self._key_of: dict[tuple[str, str, str, str | None], Labels] = {}
        self._positions: dict[Labels, list[Labels]] = {}
        self._shown: dict[Labels, int] = {}
        # Figures rendered at scrape time: single values (recorder, decode queue) and whole families (store).
        self._collectors: list[Callable[[], Iterable[tuple[str, str, str, float]]]] = []
        self._family_collectors: list[Callable[[], Iterable[Family]]] = []
        # Figures counted from records elsewhere (the ledger's), told of each durable batch as these counters are.
        self._observers: list[Callable[[Sequence[RequestRecord]], None]] = []

    def add_collector(self, collect: Callable[[], Iterable[tuple[str, str, str, float]]]) -> None:
        """``collect()`` yields ``(name, help, type, value)`` of unlabelled figures at every scrape."""
        self._collectors.append(collect)

    def add_families(self, collect: Callable[[], Iterable[Family]]) -> None:
        """``collect()`` yields labelled :class:`Family` objects at every scrape."""
        self._family_collectors.append(collect)

    def add_observer(self, observe: Callable[[Sequence[RequestRecord]], None]) -> None:
        """``observe(records)`` is told of every batch these counters count, once."""
        self._observers.append(observe)

    def observe(self, records: Sequence[RequestRecord], where: str) -> None:
        # A spooled batch is counted when spooled; its later replay is the same records again.
        if where not in ("written", "spooled"):
            return
        with self._lock:
            for rec in records:
                self._observe_one(rec)
        for observe in self._observers:
            observe(records)

    def _key(self, rec: RequestRecord) -> Labels:
        """The record's label set; the first time it is seen, zero samples for it in every family."""
        names = (rec.workload, rec.target_model, rec.drafter, rec.draft_model)
        key = self._key_of.get(names)
        if key is None:
            key = self._key_of[names] = self._new_key(rec)
        return key

    def _new_key(self, rec: RequestRecord) -> Labels:
        drafter = Pair(rec.target_model, rec.drafter, rec.draft_model).label.removeprefix(f"{rec.target_model}/")
        key: Labels = (("workload", rec.workload), ("target", rec.target_model), ("drafter", drafter))
        if key not in self._keys and len(self._keys) >= MAX_LABEL_SETS:
            key = OTHER_KEY
        if key in self._keys:
            return key
        self._keys.add(key)
        for spec in RECORD_FAMILIES:
            if spec.name == ACCEPTED_PER_POS:
                continue  # positions are filled as records show them
            for labels in [(*key, ("mode", mode)) for mode in MODES] if spec.by_mode else [key]:
                if spec.buckets:
                    self._histograms[spec.name][labels] = _Histogram(spec.buckets)
                else:
                    self._counters[spec.name][labels] = 0.0
        return key

    def _observe_one(self, rec: RequestRecord) -> None:
        key = self._key(rec)
        by_mode: Labels = (*key, ("mode", rec.mode))
        c = self._counters
        c[REQUESTS][by_mode] += 1
        if rec.finish_reason == "error":
            c[ERRORS][by_mode] += 1
        c[PROMPT_TOKENS][by_mode] += rec.prompt_tokens
        c[GENERATION_TOKENS][by_mode] += rec.output_tokens
        c[DRAFTS][key] += rec.num_spec_steps
        c[DRAFT_TOKENS][key] += rec.num_draft_tokens
        c[ACCEPTED_TOKENS][key] += rec.num_accepted_tokens
        per_pos = c[ACCEPTED_PER_POS]
        positions = self._positions.get(key)
        if positions is None:
            positions = self._positions[key] = [_position(key, p) for p in range(MAX_POSITIONS + 1)]
        # Every position the draft length allows, even one never accepted yet, so its rate exists.
        width = min(max(rec.num_speculative_tokens, len(rec.accepted_per_position)), MAX_POSITIONS + 1)
        shown = self._shown.get(key, 0)
        if width > shown:
            for labels in positions[shown:width]:
                per_pos.setdefault(labels, 0.0)
            self._shown[key] = width
        for position, accepted in enumerate(rec.accepted_per_position):
            per_pos[positions[min(position, MAX_POSITIONS)]] += accepted
        tpot = rec.decode_ms_per_token
        if tpot is not None:
            self._histograms[TPOT][by_mode].observe(tpot / 1000)
        if rec.ttft_ms is not None:
            self._histograms[TTFT][by_mode].observe(rec.ttft_ms / 1000)

    def render(self) -> str:
        """The Prometheus text format (version 0.0.4)."""
        build = [((("version", self._version),), 1.0)]
        lines = _family_lines(
            Family("draftwatch_build_info", "The draftwatch version of this process.", "gauge", build)
        )
        with self._lock:
            for spec in RECORD_FAMILIES:
                if spec.buckets:
                    lines += _histogram_lines(spec, self._histograms[spec.name])
                else:
                    lines += _family_lines(
                        Family(spec.name, spec.help, "counter", sorted(self._counters[spec.name].items()))
                    )
        for collect in self._collectors:
            for name, help_text, kind, value in collect():
                lines += _family_lines(Family(name, help_text, kind, [((), value)]))
        for collect_families in self._family_collectors:
            for family in collect_families():
                lines += _family_lines(family)
        return "\n".join(lines) + "\n"


def _position(key: Labels, position: int) -> Labels:
    return (*key, ("position", str(position) if position < MAX_POSITIONS else OTHER))


def _family_lines(family: Family) -> list[str]:
    lines = [f"# HELP {family.name} {family.help}", f"# TYPE {family.name} {family.kind}"]
    return lines + [f"{family.name}{_labels(labels)} {_number(value)}" for labels, value in family.samples]


def _histogram_lines(spec: _Spec, histograms: dict[Labels, _Histogram]) -> list[str]:
    name = spec.name
    lines = [f"# HELP {name} {spec.help}", f"# TYPE {name} histogram"]
    for labels, hist in sorted(histograms.items()):
        cumulative = 0
        for bound, count in zip(hist.buckets, hist.counts, strict=True):
            cumulative += count
            lines.append(f"{name}_bucket{_labels((*labels, ('le', _number(bound))))} {cumulative}")
        lines.append(f"{name}_bucket{_labels((*labels, ('le', '+Inf')))} {hist.count}")
        lines.append(f"{name}_sum{_labels(labels)} {_number(hist.total)}")
        lines.append(f"{name}_count{_labels(labels)} {hist.count}")
    return lines


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{key}="{_escape(value)}"' for key, value in labels)
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if float(value).is_integer() else repr(float(value))


MAX_AGE_S: Final = 5.0
WAIT_S: Final = 0.25
ALERT_STATES: Final = ("pending", "firing")
# An alert row per fingerprint: far fewer pending or firing ones than this in any real database.
MAX_ALERT_ROWS: Final = 10_000
_SIGNAL_LABELS: Final = {"job": "scheduler_job", "host": "host"}


@dataclass(frozen=True, slots=True)
class StoreRead:
    """One read of the database's figures."""

    finished_at: datetime | None  # of the newest drift run
    results: Sequence[StoredResult]
    health: Sequence[Signal]
    alerts: Sequence[AlertItem]
    scraped: Sequence[ScrapedSummary] = ()
    targets: Sequence[TargetHealth] = ()
    rollouts: Sequence[Rollout] = ()  # the active ones, one per deployment


def store_families(read: StoreRead | None, settings: Settings) -> list[Family]:
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
        *_rollout_families(read.rollouts if read else ()),
    ]


def _rollout_families(rollouts: Sequence[Rollout]) -> list[Family]:
    """Each active rollout's step and share, and per workload of its newest judgement the score and decode speed."""
    steps: list[tuple[Labels, float]] = []
    shares: list[tuple[Labels, float]] = []
    scores: list[tuple[Labels, float]] = []
    ratios: list[tuple[Labels, float]] = []
    for r in rollouts:
        labels: Labels = (("deployment", r.deployment), ("drafter", r.drafter), ("rollout", str(r.id)))
        steps.append((labels, float(r.step + 1)))
        shares.append((labels, r.step_share))
        judged = r.judgement.get("workloads", {})
        for workload in sorted(judged)[:MAX_LABEL_SETS]:
            found = judged[workload]
            ratio = next((m.get("ratio") for m in found.get("metrics", ()) if m.get("metric") == "decode_speed"), None)
            scores.append(((*labels, ("workload", workload)), _or_nan(found.get("score"))))
            ratios.append(((*labels, ("workload", workload)), _or_nan(ratio)))
    return [
        Family("draftwatch_rollout_step", "An active drafter rollout's current step, 1-based.", "gauge", steps),
        Family(
            "draftwatch_rollout_share",
            "The share of a deployment's speculative requests a rollout's candidate drafter serves now.",
            "gauge",
            shares,
        ),
        Family(
            "draftwatch_rollout_score",
            "A rollout's newest judgement per workload: the share of judged metrics the candidate passed, 0-100 "
            "(NaN: unjudged).",
            "gauge",
            scores,
        ),
        Family(
            "draftwatch_rollout_decode_speed_ratio",
            "A rollout's newest judgement per workload: the current drafter's decode ms per token over the "
            "candidate's (above 1: the candidate is faster; NaN: not measured).",
            "gauge",
            ratios,
        ),
    ]


def _or_nan(value: object) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan


def _verdict_samples(read: StoreRead | None) -> tuple[list[tuple[Labels, float]], list[tuple[Labels, float]]]:
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


def _alert_counts(read: StoreRead | None, settings: Settings) -> list[tuple[Labels, float]]:
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


def read_figures(engine: Engine, settings: Settings) -> StoreRead:
    run = latest_run(engine)
    now = datetime.now(UTC)
    return StoreRead(
        finished_at=run.finished_at if run else None,
        results=latest_results(engine, run_id=run.run_id) if run else [],
        health=health_signals(engine, settings, now),
        alerts=list_alerts(engine, ALERT_STATES, limit=MAX_ALERT_ROWS),
        scraped=scraped_summaries(engine, now - settings.drift.current_window, now),
        targets=target_health(engine),
        rollouts=list(active_rollouts(engine).values()),
    )


class StoreFigures:
    """The collector of the database's figures, read on a thread of its own (see the module docstring)."""

    def __init__(self, engine: Engine, settings: Settings) -> None:
        self._engine, self._settings = engine, settings
        self._lock = threading.Lock()
        self._families = store_families(None, settings)
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
            self._families = store_families(read_figures(self._engine, self._settings), self._settings)
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


def own_figures(state: ApiState) -> Iterable[tuple[str, str, str, float]]:
    """This process's state at scrape time: ``(name, help, type, value)`` of unlabelled figures."""
    stats = state.recorder.stats()
    yield "draftwatch_recorder_queued_records", "Records waiting in the recorder's queue.", "gauge", stats.queued
    for name in ("written", "spooled", "replayed", "duplicates", "rejected", "failed"):
        yield (
            f"draftwatch_recorder_{name}_total",
            f"Records the recorder {name} (cumulative).",
            "counter",
            float(getattr(stats, name)),
        )
    yield (
        "draftwatch_recorder_spool_pending",
        "1 while spooled records wait for the database.",
        "gauge",
        float(stats.spool_pending),
    )
    yield (
        "draftwatch_recorder_database_available",
        "1 when the last write reached the database.",
        "gauge",
        float(stats.database_available),
    )
    if state.router is not None:
        yield (
            "draftwatch_proxy_unrecorded_total",
            "Proxied responses forwarded but not recorded (their figures could not be read).",
            "counter",
            float(state.proxy_unrecorded),
        )
        yield (
            "draftwatch_recorder_dropped_total",
            "Proxied records dropped: the recorder's queue and its spill hand-off were both full.",
            "counter",
            float(stats.dropped),
        )
        yield (
            "draftwatch_recorder_database_hung",
            "1 while a database call has run past recorder.write_timeout_s (records spool meanwhile).",
            "gauge",
            float(stats.database_hung),
        )
    if state.capture is not None:
        captured = state.capture.stats()
        for name, meaning in (
            ("considered", "Requests the prompt sample considered (past capture.share)."),
            ("kept", "Considered prompts that entered their workload's reservoir."),
            ("unusable", "Considered requests without a text prompt evaluate can replay."),
            ("dropped", "Considered prompts dropped because the capture queue was full."),
            ("failed", "Considered prompts lost to an error reading the request or writing the file."),
        ):
            yield f"draftwatch_capture_{name}_total", meaning, "counter", float(getattr(captured, name))
    if state.worker is not None:
        yield (
            "draftwatch_decode_queue_depth",
            "Generation requests waiting for the decoder.",
            "gauge",
            float(state.worker.depth),
        )
        yield (
            "draftwatch_decode_rejected_total",
            "Generation requests refused with 503 (queue full).",
            "counter",
            float(state.worker.rejected),
        )


@router.get(
    "/metrics",
    dependencies=workloads.read,
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain": {}}}, **workloads.READ_ERRORS},
    summary="Prometheus text format",
)
async def metrics(request: Request) -> PlainTextResponse:
    # Rendering may wait a moment on the database's figures (StoreFigures): on a thread, not the event loop.
    body = await anyio.to_thread.run_sync(api_state(request).metrics.render)
    return PlainTextResponse(body, media_type="text/plain; version=0.0.4; charset=utf-8")


def upstreams_up(router: Router) -> list[Family]:
    """Proxy mode: each replica of each pool, 1 while it answers (see ``proxy.eject_after``)."""
    help_text = (
        "1 while a replica answers; 0 from its eject (proxy.eject_after failures in a row) until it answers again."
    )
    return [Family("draftwatch_proxy_upstream_up", help_text, "gauge", router.upstreams_up())]


def watch(state: ApiState) -> None:
    """Have ``state.metrics`` render, at every scrape, this process's state and then the database's figures."""
    state.metrics.add_collector(lambda: own_figures(state))
    router = state.router
    if router is not None:
        state.metrics.add_families(lambda: upstreams_up(router))
    state.metrics.add_families(StoreFigures(state.engine, state.settings).collect)
    ledger = LedgerCounters(state.engine)
    state.metrics.add_observer(ledger.observe)
    state.metrics.add_families(ledger.collect)


# The scheduler stores new rates once a drift run (5 minutes by default); reading them is one small row.
LEDGER_MAX_AGE_S: Final = 60.0
OUTCOMES: Final = ("saved", "lost", "inconclusive", "unmeasured")


class LedgerCounters:
    """The speculation ledger as counters: each speculative decode token this process records, valued at its load.

    A token is valued at its workload's measured rate at its load level (``t_plain - t_spec`` of the
    ledger over the last day, as the scheduler's newest drift run stored it:
    :mod:`monitor.drift.detectors.ledger_rates`; read at most every :data:`LEDGER_MAX_AGE_S` on a thread of its
    own) and counted as saved or lost where the level's interval clears 1, else under
    ``outcome="inconclusive"`` or ``"unmeasured"`` with no seconds; all unmeasured before a drift run
    stored rates. Counters per process, as the record counters are: Prometheus sums the replicas, and
    ``increase(..._saved_total[24h]) - increase(..._lost_total[24h])`` is the day's net.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._rates = LedgerRates()
        self._seconds: dict[tuple[str, str], float] = {}  # (workload, saved | lost)
        self._tokens: dict[tuple[str, str], float] = {}  # (workload, outcome)
        self._workloads: set[str] = set()  # those counted under their own name, at most MAX_LABEL_SETS
        self._read_at = -math.inf
        self._reading: threading.Thread | None = None

    def observe(self, records: Sequence[RequestRecord]) -> None:
        self._refresh()
        counted = [r for r in records if r.mode == "speculative" and r.finish_reason != "error" and r.output_tokens > 1]
        # One call for the batch: numpy's cost is per call (see Metrics._key_of on the batch's thread).
        inflight = [np.nan if r.upstream_inflight is None else float(r.upstream_inflight) for r in counted]
        levels = load_level(np.array(inflight, dtype=float)).tolist()
        with self._lock:
            for rec, level in zip(counted, levels, strict=True):
                self._count(rec, level)

    def _count(self, rec: RequestRecord, level: int) -> None:
        workload = rec.workload
        if workload not in self._workloads and len(self._workloads) >= MAX_LABEL_SETS:
            workload = OTHER
        tokens = rec.output_tokens - 1
        per_token, call = self._rates.rate(rec.workload, level) or (None, "not_measured")
        outcome = {"gains": "saved", "loses": "lost", "inconclusive": "inconclusive"}.get(call, "unmeasured")
        self._zero(workload)
        self._tokens[(workload, outcome)] += tokens
        if per_token is not None and outcome in ("saved", "lost"):
            self._seconds[(workload, outcome)] += abs(per_token) * tokens

    def _zero(self, workload: str) -> None:
        self._workloads.add(workload)
        for outcome in OUTCOMES:
            self._tokens.setdefault((workload, outcome), 0.0)
        for side in ("saved", "lost"):
            self._seconds.setdefault((workload, side), 0.0)

    def collect(self) -> list[Family]:
        self._refresh()
        with self._lock:
            seconds, tokens, crossover = dict(self._seconds), dict(self._tokens), self._rates.crossover
        return [
            Family(
                "draftwatch_speculation_gpu_seconds_saved_total",
                "Replica-seconds speculation saved against plain decoding at the same load, per workload: recorded "
                "speculative decode tokens valued at their load level's measured rate (levels whose interval is "
                "above 1).",
                "counter",
                [((("workload", w),), v) for (w, side), v in sorted(seconds.items()) if side == "saved"],
            ),
            Family(
                "draftwatch_speculation_gpu_seconds_lost_total",
                "Replica-seconds speculation cost against plain decoding at the same load, per workload (levels "
                "whose interval is below 1).",
                "counter",
                [((("workload", w),), v) for (w, side), v in sorted(seconds.items()) if side == "lost"],
            ),
            Family(
                "draftwatch_speculation_ledger_tokens_total",
                "Recorded speculative decode tokens per workload by the ledger's outcome at their load (saved, lost, "
                "inconclusive: the interval spans 1, unmeasured: no ratio at that load).",
                "counter",
                [((("workload", w), ("outcome", o)), v) for (w, o), v in sorted(tokens.items())],
            ),
            Family(
                "draftwatch_speculation_crossover_inflight",
                "The lowest in-flight count at which speculation loses, per workload and pair, from the newest ledger "
                "(NaN: none seen).",
                "gauge",
                [((("workload", w), ("pair", p)), v) for (w, p), v in sorted(crossover.items())[:MAX_LABEL_SETS]],
            ),
        ]

    def _refresh(self) -> None:
        with self._lock:
            if self._reading is not None or time.monotonic() - self._read_at < LEDGER_MAX_AGE_S:
                return
            self._reading = threading.Thread(target=self._read, name="metrics-ledger-read", daemon=True)
            self._reading.start()

    def _read(self) -> None:
        try:
            with self._engine.connect() as conn:
                stored = newest_ledger_rates(conn)
            if stored is not None:
                # Bounded label sets: the workloads that served most, as the ledger lists them.
                kept = dict(list(stored.rates.items())[:MAX_LABEL_SETS])
                with self._lock:
                    self._rates = LedgerRates(kept, stored.crossover)
        except Exception as error:  # the last rates stay; the next read after LEDGER_MAX_AGE_S tries again
            # Debug: a database outage is the recorder's two log lines (its start and its end), not one per reader.
            log.debug("metrics: reading the speculation ledger's rates failed (%s)", describe(error))
        finally:
            with self._lock:
                self._read_at = time.monotonic()
                self._reading = None
