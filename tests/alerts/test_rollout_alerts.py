"""The rollout alerts, raised from a real rollout's events and delivered to a real webhook receiver.

The rollout runs as the scheduler runs it (``advance_rollouts`` judging stored records of both
drafters, tests/proxy/test_rollout.py's traffic); after each of its events the scheduler's health
job evaluates the rules and a delivery pass sends what it notified. Every event is one alert
episode: it fires once, with the event's reason in its description, and resolves when the rollout
moves on. On a SQLite file and on PostgreSQL.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from monitor.config import Settings
from monitor.notify.delivery import deliver_pending
from monitor.proxy.rollout import abort, advance_rollouts, start_rollout
from monitor.scheduler.health import evaluate_health, rollout_signals
from monitor.store.rollouts import rollout_events
from tests.alerting import Receiver, make_settings, minutes
from tests.proxy.test_rollout import INTERVAL, PROXY, interval_of, rollout_settings
from tests.records import T0

Notice = tuple[str, str, dict[str, str]]  # status, rule, labels (severity and alertname left out)


class Watch:
    """The health job and a delivery pass, run at a minute of the test's alert clock; what the receiver got."""

    def __init__(self, engine: Engine, settings: Settings, receiver: Receiver) -> None:
        self.engine, self.settings, self.receiver = engine, settings, receiver
        self.minute = 0.0
        self.alerts: list[dict[str, Any]] = []

    def run(self) -> list[Notice]:
        self.minute += 1
        before = len(self.receiver.seen)
        evaluate_health(self.engine, self.settings, now=minutes(self.minute))
        report = deliver_pending(self.engine, self.settings.delivery, now=minutes(self.minute))
        assert report.dead == 0
        got = [a for _, _, body in self.receiver.seen[before:] for a in json.loads(body)["alerts"]]
        self.alerts += got
        return sorted((a["status"], a["rule"], _labels(a)) for a in got)

    def description(self, rule: str, **labels: str) -> str:
        """The description of the newest firing notice of ``rule`` with ``labels``."""
        return self.annotation("description", rule, **labels)

    def summary(self, rule: str, **labels: str) -> str:
        """The summary (the title a receiver shows) of the newest firing notice of ``rule`` with ``labels``."""
        return self.annotation("summary", rule, **labels)

    def annotation(self, name: str, rule: str, **labels: str) -> str:
        found = [a for a in self.alerts if a["rule"] == rule and a["status"] == "firing" and _labels(a) == labels]
        assert found, (rule, labels)
        return str(found[-1]["annotations"][name])


def story_speed(engine: Engine, rollout_id: int | None) -> str:
    """The candidate's decode speed on story where the judge kept it or rolled back: ``0.78x [0.73, 0.84]``."""
    (event,) = [e for e in rollout_events(engine, rollout_id=rollout_id) if e.kind in ("kept", "rolled_back")]
    speed = next(m for m in event.judgement["workloads"]["story"]["metrics"] if m["metric"] == "decode_speed")
    return f"{speed['ratio']:.2f}x [{speed['ci'][0]:.2f}, {speed['ci'][1]:.2f}]"


def _labels(alert: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in alert["labels"].items() if k not in ("alertname", "severity")}


@pytest.fixture
def watch(engine: Engine, tmp_path: Path, receiver: Receiver) -> Watch:
    url = engine.url.render_as_string(hide_password=False)
    return Watch(engine, make_settings(tmp_path, url, [{"url": receiver.url, "format": "json"}]), receiver)


def test_every_rollout_event_fires_its_alert_once_with_the_reason(engine: Engine, watch: Watch) -> None:
    s = rollout_settings(per_workload=True)
    r = start_rollout(engine, PROXY, s, T0)
    assert r.id is not None
    assert watch.run() == []  # a start is no alert
    # story loses: kept on the current drafter, a rollback of that workload (critical), at once.
    interval_of(engine, T0, {"copy": (10.0, 7.0), "story": (10.0, 13.0)})
    (kept,) = advance_rollouts(engine, s, T0 + timedelta(minutes=5, seconds=1))
    assert watch.run() == [("firing", "rollout_rolled_back", {"deployment": "*", "workload": "story"})]
    described = watch.description("rollout_rolled_back", deployment="*", workload="story")
    assert described == f"rollout {r.id}, ngram-greedy: {kept.reason}" and "decode_speed fail" in described
    # Its title says what happened to whom, in words: the workload kept, not the rollout rolled back.
    speed = story_speed(engine, r.id)
    assert watch.summary("rollout_rolled_back", deployment="*", workload="story") == (
        f"rollout {r.id} kept the current drafter on story: decode speed {speed}"
    )
    (story,) = [a for a in watch.alerts if a["rule"] == "rollout_rolled_back"]
    assert story["severity"] == "critical" and story["value"] < 1  # the candidate's decode speed ratio
    assert watch.run() == []  # still kept: no second notice
    # A step advanced, then promoted (passing the last step below 100 %): each step's alert fires once and
    # resolves at the next event.
    t = T0
    expected: list[list[Notice]] = [
        [("firing", "rollout_advanced", {"deployment": "*", "step": "2"})],
        [("firing", "rollout_promoted", {"deployment": "*"}),
         ("resolved", "rollout_advanced", {"deployment": "*", "step": "2"})],
    ]  # fmt: skip
    for notices in expected:
        interval_of(engine, t, {"copy": (10.0, 7.0), "story": (10.0, 13.0)})
        t += INTERVAL + timedelta(seconds=1)
        (event,) = advance_rollouts(engine, s, t)
        assert watch.run() == notices, event.reason
        assert watch.run() == []
    advanced = [e for e in rollout_events(engine, rollout_id=r.id) if e.kind == "advanced"]
    assert advanced[0].reason.startswith("step 2 of 3: every judged workload passed (scores copy 100")
    for step, event in zip(("2",), advanced, strict=True):
        described = watch.description("rollout_advanced", deployment="*", step=step)
        assert described == f"rollout {r.id}, ngram-greedy: {event.reason}"
    assert watch.summary("rollout_advanced", deployment="*", step="2") == (
        f"rollout {r.id} advanced ngram-greedy to step 2 of 3: 50% of the speculative requests"
    )
    promoted = watch.description("rollout_promoted", deployment="*")
    assert "promoted: every judged workload passed the last step" in promoted
    assert "kept on the current drafter: story" in promoted
    assert watch.summary("rollout_promoted", deployment="*") == (
        f"rollout {r.id} promoted ngram-greedy on copy; kept the current drafter on story: decode speed {speed}"
    )
    # The operator ends the promoted rollout: the promotion and the kept workload resolve.
    abort(engine, r.id, t)
    assert watch.run() == [
        ("resolved", "rollout_promoted", {"deployment": "*"}),
        ("resolved", "rollout_rolled_back", {"deployment": "*", "workload": "story"}),
    ]
    # A whole rollout rolled back: one critical alert for the deployment, with the judge's reason.
    later = t + timedelta(hours=1)
    again = start_rollout(engine, PROXY, rollout_settings(), later)
    interval_of(engine, later, {"copy": (10.0, 7.0), "story": (10.0, 13.0)})
    (back,) = advance_rollouts(engine, rollout_settings(), later + timedelta(minutes=5, seconds=1))
    assert back.kind == "rolled_back"
    assert watch.run() == [("firing", "rollout_rolled_back", {"deployment": "*"})]
    whole = watch.description("rollout_rolled_back", deployment="*")
    assert whole == f"rollout {again.id}, ngram-greedy: {back.reason}"
    assert "story: decode_speed fail" in back.reason
    assert watch.summary("rollout_rolled_back", deployment="*") == (
        f"rollout {again.id} rolled back ngram-greedy at step 1 (10% of the speculative requests): story: decode speed "
        f"{story_speed(engine, again.id)}"
    )
    # No alert of a rollout speaks the drift tests' words (a decision, an effect size).
    for alert in watch.alerts:
        assert "drift," not in alert["annotations"]["description"], alert
    assert watch.run() == []
    # Once per event: every alert fired exactly once, and nothing else fired.
    firing = [a for a in watch.alerts if a["status"] == "firing"]
    fired = Counter((a["rule"], json.dumps(_labels(a), sort_keys=True)) for a in firing)
    assert set(fired.values()) == {1} and len(fired) == 4  # kept, step 2, promoted, rolled back
    severities = {a["rule"]: a["severity"] for a in watch.alerts}
    assert severities == {"rollout_rolled_back": "critical", "rollout_advanced": "info", "rollout_promoted": "info"}


def test_the_next_rollout_clears_what_an_earlier_one_left(engine: Engine, watch: Watch) -> None:
    """A rollout rolled back stays an alert until the deployment's next rollout starts; its steps and kept
    workloads are cleared by the next rollout's signals even where that one has fewer steps."""
    long = rollout_settings(steps=(0.1, 0.25, 0.5, 1.0), per_workload=True)
    r = start_rollout(engine, PROXY, long, T0)
    assert r.id is not None
    t = T0
    for _ in range(2):
        interval_of(engine, t, {"copy": (10.0, 7.0)})
        t += INTERVAL + timedelta(seconds=1)
        advance_rollouts(engine, long, t)
    assert watch.run() == [("firing", "rollout_advanced", {"deployment": "*", "step": "3"})]
    abort(engine, r.id, t, "aborted by hand: the candidate's pool is being replaced")
    assert watch.run() == [("resolved", "rollout_advanced", {"deployment": "*", "step": "3"})]
    short = rollout_settings(steps=(0.5, 1.0))
    start_rollout(engine, PROXY, short, t + INTERVAL)
    signals = {(s.test, json.dumps(s.labels, sort_keys=True)): s.decision for s in rollout_signals(engine)}
    # The new rollout has two steps, the earlier one four: steps 2-4 are all judged (clear).
    steps = [json.loads(labels)["step"] for test, labels in signals if test == "rollout_step"]
    assert steps == ["2", "3", "4"] and set(signals.values()) == {"no_drift"}
