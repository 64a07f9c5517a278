"""The alert state machine on both databases: pending → firing → resolved, silences, ack, flapping, grouping."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from monitor.alerts.evaluate import evaluate_alerts
from monitor.alerts.queries import acknowledge, list_alerts
from monitor.alerts.rules import DEFAULT_RULES
from monitor.alerts.silences import create_silence, expire_silence
from monitor.notify.models import NotificationRow
from tests.alerting import make_settings, minutes, result


def _bodies(engine: Engine) -> list[dict[str, object]]:
    with engine.connect() as conn:
        rows = conn.execute(select(NotificationRow.body).order_by(NotificationRow.id)).scalars().all()
    return [json.loads(b) for b in rows]


def _url(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def test_pending_firing_resolved_with_notices(engine: Engine, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, _url(engine), [{"url": "http://127.0.0.1:9/x", "format": "json"}])
    timeline = [("drift", -0.2), ("drift", -0.2), ("drift", -0.2), ("insufficient_data", None),
                ("no_drift", 0.0), ("no_drift", 0.0), ("no_drift", 0.0)]  # fmt: skip
    states = []
    for i, (decision, effect) in enumerate(timeline):
        evaluate_alerts(engine, settings.alert_config, [result(decision, effect)], now=minutes(5 * i))
        states.append(list_alerts(engine)[0].state)
    assert states == ["pending", "firing", "firing", "firing", "firing", "resolved", "resolved"]
    bodies = _bodies(engine)
    assert [b["status"] for b in bodies] == ["firing", "resolved"]
    alert = bodies[0]["alerts"][0]  # type: ignore[index]
    assert alert["labels"]["alertname"] == "acceptance_drop" and alert["labels"]["workload"] == "code"
    # A rising acceptance is drift too, but not a drop: the rule's direction keeps it quiet.
    evaluate_alerts(engine, settings.alert_config, [result("drift", +0.2, workload="chat")] * 1, now=minutes(60))
    evaluate_alerts(engine, settings.alert_config, [result("drift", +0.2, workload="chat")], now=minutes(65))
    assert len(_bodies(engine)) == 2


def test_pending_that_clears_says_nothing_and_grouping(engine: Engine, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, _url(engine), [{"url": "http://127.0.0.1:9/x"}])
    evaluate_alerts(engine, settings.alert_config, [result("drift", -0.2)], now=minutes(0))
    evaluate_alerts(engine, settings.alert_config, [result("no_drift", 0.0)], now=minutes(5))
    assert _bodies(engine) == [] and list_alerts(engine)[0].state == "inactive"
    # Two rules on one workload firing together: one notification (grouped by workload).
    both = [result("drift", -0.2), result("drift", 1.5, test="latency"), result("drift", -0.3, workload="chat")]
    evaluate_alerts(engine, settings.alert_config, both, now=minutes(10))
    evaluate_alerts(engine, settings.alert_config, both, now=minutes(15))
    bodies = _bodies(engine)
    assert sorted(len(b["alerts"]) for b in bodies) == [1, 2]  # type: ignore[arg-type]
    assert {b["groupLabels"]["workload"] for b in bodies} == {"code", "chat"}  # type: ignore[index]


def test_silence_suppresses_and_expiry_notifies(engine: Engine, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, _url(engine), [{"url": "http://127.0.0.1:9/x"}])
    silence = create_silence(engine, [{"name": "workload", "value": "code"}], minutes(-1), minutes(60), "ada",
                             "known issue, deploy in progress", minutes(-1))  # fmt: skip
    for i in range(4):
        evaluate_alerts(
            engine, settings.alert_config, [result("drift", -0.2), result("drift", -0.2, "chat")], now=minutes(5 * i)
        )
    bodies = _bodies(engine)
    assert [b["groupLabels"]["workload"] for b in bodies] == ["chat"]  # type: ignore[index]
    assert expire_silence(engine, silence.id, minutes(21))
    evaluate_alerts(engine, settings.alert_config, [result("drift", -0.2)], now=minutes(25))
    assert [b["groupLabels"]["workload"] for b in _bodies(engine)] == ["chat", "code"]  # type: ignore[index]


def test_ack_stops_repeats_but_not_the_resolved_notice(engine: Engine, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, _url(engine), [{"url": "http://127.0.0.1:9/x"}],
                             DRAFTWATCH_ALERTS_REPEAT_INTERVAL="10m")  # fmt: skip
    for i in range(4):  # fires at 5, repeats due at 15
        evaluate_alerts(engine, settings.alert_config, [result("drift", -0.2)], now=minutes(5 * i))
    assert [b["status"] for b in _bodies(engine)] == ["firing", "firing"]
    alert_id = list_alerts(engine)[0].id
    assert acknowledge(engine, alert_id, "ada", "looking", minutes(16)).acknowledged  # type: ignore[union-attr]
    for i in range(4, 12):
        evaluate_alerts(engine, settings.alert_config, [result("drift", -0.2)], now=minutes(5 * i))
    assert len(_bodies(engine)) == 2
    for i in range(12, 14):
        evaluate_alerts(engine, settings.alert_config, [result("no_drift", 0.0)], now=minutes(5 * i))
    assert [b["status"] for b in _bodies(engine)] == ["firing", "firing", "resolved"]


def test_flapping_signal_does_not_storm(engine: Engine, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, _url(engine), [{"url": "http://127.0.0.1:9/x"}],
                             DRAFTWATCH_ALERTS_FOR_RUNS="1", DRAFTWATCH_ALERTS_CLEAR_RUNS="1")  # fmt: skip
    for i in range(40):  # drift, clear, drift, clear ... every minute for 40 minutes
        decision, effect = ("drift", -0.2) if i % 2 == 0 else ("no_drift", 0.0)
        evaluate_alerts(engine, settings.alert_config, [result(decision, effect)], now=minutes(i))
    statuses = [b["status"] for b in _bodies(engine)]
    # At most flap_max_fires (3) firing notices in the hour, each with at most one resolved notice.
    assert statuses.count("firing") == 3 and statuses.count("resolved") <= 3
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(NotificationRow)).scalar_one() <= 6
    # With the default hysteresis (2 runs to fire, 2 to clear) the same signal never fires at all.
    quiet = make_settings(tmp_path, _url(engine), [{"url": "http://127.0.0.1:9/x"}])
    for i in range(20):
        decision, effect = ("drift", -0.2) if i % 2 == 0 else ("no_drift", 0.0)
        evaluate_alerts(engine, quiet.alert_config, [result(decision, effect, workload="chat")], now=minutes(100 + i))
    assert not [b for b in _bodies(engine) if b["groupLabels"]["workload"] == "chat"]  # type: ignore[index]


def test_an_acceptance_drop_within_one_prompt_length_bucket_raises_the_acceptance_alert() -> None:
    (rule,) = [r for r in DEFAULT_RULES if r.name == "acceptance_drop"]
    assert rule.applies("drift", "acceptance_by_length", "acceptance_rate[prompt 1024-4096]")
    assert rule.verdict("drift", -0.15) is True and rule.verdict("drift", 0.15) is False
