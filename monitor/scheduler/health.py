"""Health signals for the ``health`` rules: scheduler jobs, drift staleness, recorder spool, dead letters.

* ``job_failures`` (label ``job``): the last ``scheduler.failure_alert_after`` finished runs of a
  job all failed; a failing job is simply retried on its next tick meanwhile.
* ``drift_stale`` (label ``job=drift``): the last successful drift run is older than three drift
  intervals (the scheduler stopped doing its main job).
* ``recorder_spool`` (label ``host``): spool segments older than a minute lie in this host's spool
  directory, i.e. a recorder here could not write to the database for a while.
* ``dead_letters``: a notification became a dead letter in the last day.
* ``scrape_target`` (label ``target``): a ``[[scrape]]`` target failed its last
  ``SCRAPE_FAILURES`` scrapes (down, or a body that is not its engine's exposition).
* ``routing`` (label ``workload``): the workload's newest ``routing_events`` row routes it to the
  plain baseline.
* ``rollout_step``, ``rollout_rollback``, ``rollout_promotion`` (label ``deployment``): what each
  deployment's newest drafter rollout and its ``rollout_events`` rows say (:func:`rollout_signals`).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from monitor.alerts.evaluate import Evaluation, Signal, evaluate_signals, stale_cutoff
from monitor.config import Settings
from monitor.drift.detectors.judge import in_words
from monitor.ingest.spool import PREFIX, SUFFIX
from monitor.notify.models import NotificationRow
from monitor.scheduler.models import JobRunRow
from monitor.store.rollouts import Rollout, RolloutEvent, rollout_events, rollouts
from monitor.store.routing import latest_routing
from monitor.store.scrape import target_health
from monitor.store.types import Fence

SPOOL_AGE_S: Final = 60.0
# One failed scrape is a blip (a restart, a slow response); three in a row are an outage.
SCRAPE_FAILURES: Final = 3
DEAD_LETTER_WINDOW: Final = timedelta(days=1)


def _age(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:  # replayed and removed meanwhile
        return 0.0


def _decision(active: bool) -> str:
    return "drift" if active else "no_drift"


def health_signals(engine: Engine, settings: Settings, now: datetime) -> list[Signal]:
    """The current health signals (see the module docstring)."""
    signals: list[Signal] = []
    j = JobRunRow
    with engine.connect() as conn:
        for (job,) in conn.execute(select(j.job).distinct()).all():
            statuses = conn.execute(
                select(j.status)
                .where(j.job == job, j.status.in_(("ok", "failed")))
                .order_by(j.started_at.desc())
                .limit(settings.scheduler.failure_alert_after)
            ).scalars().all()  # fmt: skip
            if len(statuses) == settings.scheduler.failure_alert_after:
                active = all(s == "failed" for s in statuses)
                signals.append(Signal("health", "job_failures", _decision(active), {"job": job}))
        last_ok = conn.execute(select(func.max(j.finished_at)).where(j.job == "drift", j.status == "ok")).scalar()
        if last_ok is not None:
            stale = last_ok < stale_cutoff(now, settings.scheduler.drift_interval)
            signals.append(Signal("health", "drift_stale", _decision(stale), {"job": "drift"}))
        n = NotificationRow
        dead = conn.execute(
            select(func.count()).where(n.status == "dead", n.created_at >= now - DEAD_LETTER_WINDOW)
        ).scalar_one()
    signals.append(Signal("health", "dead_letters", _decision(dead > 0), {}, float(dead)))
    for workload, route in sorted(latest_routing(engine).items()):
        # Active while a workload is routed to plain: the alert fires on the switch and resolves on the way back.
        signals.append(Signal("health", "routing", _decision(route.routed), {"workload": workload}, route.speedup,
                              route.reason))  # fmt: skip
    signals += rollout_signals(engine)
    for target in target_health(engine):
        failing = target.failures >= SCRAPE_FAILURES
        note = f"{target.status}: {target.error}" if failing else None
        signals.append(Signal("health", "scrape_target", _decision(failing), {"target": target.name}, None, note))
    spool = settings.recorder.spool_dir
    old = [p for p in spool.glob(f"{PREFIX}*{SUFFIX}") if _age(p) > SPOOL_AGE_S]
    host = socket.gethostname()
    signals.append(Signal("health", "recorder_spool", _decision(bool(old)), {"host": host}, float(len(old))))
    return signals


def rollout_signals(engine: Engine) -> list[Signal]:
    """The rollout checks, from each deployment's newest rollout and its events, as ``routing`` is from its rows.

    Each is active while the rollout is in the state an event put it in, so that every event is one
    episode of one alert (``for_runs`` and ``clear_runs`` 1): it fires on the event and resolves when
    the next one moves the rollout on, with the event's reason as the signal's note.

    * ``rollout_step`` (labels ``deployment``, ``step``, 1-based): running at a step it advanced to;
      it resolves at the next step, the promotion or the rollback. Effect: the step's share.
    * ``rollout_rollback`` (label ``deployment``): the rollout was rolled back; it resolves when the
      deployment's next rollout starts. With ``workload`` too: the rollout keeps that workload on the
      current drafter (``rollout.per_workload``), until an abort ends it or the next rollout starts.
      Effect: the workload's decode speed ratio in the judgement that kept it.
    * ``rollout_promotion`` (label ``deployment``): the candidate is promoted and serves; it resolves
      when the rollout is ended (``draftwatch rollout abort``, once the candidate is the upstream).

    Clear signals go with them for every step and kept workload of the deployment's listed rollouts,
    so that an alert of an earlier rollout resolves as well.
    """
    newest: dict[str, Rollout] = {}
    steps: dict[str, int] = {}
    kept: dict[str, set[str]] = {}
    for r in rollouts(engine):  # newest first
        newest.setdefault(r.deployment, r)
        steps[r.deployment] = max(steps.get(r.deployment, 0), len(r.steps))
        kept.setdefault(r.deployment, set()).update(w for w, side in r.workloads.items() if side == "current")
    signals: list[Signal] = []
    for deployment, r in sorted(newest.items()):
        signals += _rollout_signals(engine, r, steps[deployment], kept[deployment])
    return signals


def _rollout_signals(engine: Engine, r: Rollout, steps: int, kept: set[str]) -> list[Signal]:
    """One deployment's rollout signals from its newest rollout ``r`` (see :func:`rollout_signals`).

    Each active one carries its title, what happened in its user's words (the alert's summary), and
    the event's reason as its note (the description).
    """
    events = rollout_events(engine, rollout_id=r.id) if r.step > 0 or r.workloads else []
    where = f"rollout {r.id}, {r.drafter}"
    deployment = {"deployment": r.deployment}
    signals: list[Signal] = []
    for number in range(2, steps + 1):
        at = r.status == "running" and r.step + 1 == number
        event = _newest(events, "advanced", step=r.step) if at else None
        note = f"{where}: {event.reason if event else r.reason}" if at else None
        title = f"rollout {r.id} advanced {r.drafter} to step {number} of {len(r.steps)}: {_share(r)}" if at else None
        labels = {**deployment, "step": str(number)}
        signals.append(Signal("health", "rollout_step", _decision(at), labels, r.step_share if at else None, note,
                              title=title))  # fmt: skip
    back = r.status == "rolled_back"
    note = f"{where}: {r.reason}" if back else None
    signals.append(Signal("health", "rollout_rollback", _decision(back), deployment, None, note,
                          title=_rolled_back(r) if back else None))  # fmt: skip
    for workload in sorted(kept):
        held = r.workloads.get(workload) == "current" and r.status != "aborted"
        event = _newest(events, "kept", workload=workload) if held else None
        ratio = _decode_ratio(event.judgement, workload) if event else None
        note = f"{where}: {event.reason if event else f'{workload} kept on the current drafter'}" if held else None
        title = f"rollout {r.id} kept the current drafter on {_kept(workload, event)}" if held else None
        labels = {**deployment, "workload": workload}
        signals.append(Signal("health", "rollout_rollback", _decision(held), labels, ratio, note, title=title))
    promoted = r.status == "promoted"
    note = f"{where}: {r.reason}" if promoted else None
    signals.append(Signal("health", "rollout_promotion", _decision(promoted), deployment, None, note,
                          title=_promoted(r, events) if promoted else None))  # fmt: skip
    return signals


def _share(r: Rollout) -> str:
    """The share of the deployment's speculative requests the candidate serves at ``r``'s step."""
    on = "" if r.deployment == "*" else f" of {r.deployment}"
    return f"{100 * r.steps[r.step]:g}% of the speculative requests{on}"


def _rolled_back(r: Rollout) -> str:
    """``rollout 4 rolled back eagle3-v2 at step 2 (25% ...): story: decode speed 0.81x [0.74, 0.88]; ...``."""
    judged: Mapping[str, Any] = r.judgement.get("workloads", {})
    failed = [f"{w}: {in_words(j)}" for w, j in sorted(judged.items()) if j.get("outcome") == "fail"]
    why = "; ".join(failed) or r.reason.removeprefix("rolled back: ")
    return f"rollout {r.id} rolled back {r.drafter} at step {r.step + 1} ({_share(r)}): {why}"


def _kept(workload: str, event: RolloutEvent | None) -> str:
    """``extract: decode speed 0.82x [0.75, 0.90]``: a kept workload and the judgement that kept it."""
    judged = (event.judgement.get("workloads", {}) if event else {}).get(workload)
    return f"{workload}: {in_words(judged)}" if judged else workload


def _promoted(r: Rollout, events: Sequence[RolloutEvent]) -> str:
    """``rollout 3 promoted eagle3-v2 on prose; kept the current drafter on extract: decode speed 0.82x [...]``."""
    kept = sorted(w for w, side in r.workloads.items() if side == "current")
    if r.per_workload:
        on = ", ".join(sorted(w for w, side in r.workloads.items() if side == "candidate"))
    else:
        on = "every other workload" if kept else "every workload"
    told = "; ".join(_kept(w, _newest(events, "kept", workload=w)) for w in kept)
    return f"rollout {r.id} promoted {r.drafter} on {on}" + (f"; kept the current drafter on {told}" if told else "")


def _newest(
    events: Sequence[RolloutEvent], kind: str, *, step: int | None = None, workload: str | None = None
) -> RolloutEvent | None:
    """The newest event of ``kind`` (at ``step``, of ``workload``, where given)."""
    for e in reversed(events):
        if e.kind == kind and step in (None, e.step) and workload in (None, e.workload):
            return e
    return None


def _decode_ratio(judgement: Mapping[str, Any], workload: str) -> float | None:
    """The candidate's decode speed over the current drafter's for ``workload`` in a stored judgement."""
    found = judgement.get("workloads", {}).get(workload, {})
    for metric in found.get("metrics", ()):
        if metric.get("metric") == "decode_speed" and metric.get("ratio") is not None:
            return float(metric["ratio"])
    return None


def evaluate_health(
    engine: Engine, settings: Settings, *, now: datetime | None = None, fence: Fence | None = None
) -> Evaluation:
    """Evaluate the health rules now (the scheduler's ``health`` job)."""
    now = now or datetime.now(UTC)
    return evaluate_signals(
        engine, settings.alert_config, "health", health_signals(engine, settings, now), now=now, fence=fence
    )
