"""A small, realistic store for the dashboard tests, written through the store's own batch writer.

Relative to ``now`` (the dashboard's ranges end at the current minute):

* ``code``: high acceptance, speculative plus 60 holdout requests (a measured speedup), and a new
  draft version (d1 to d2) early in the current day (a deployment event);
* ``chat``: acceptance fell from about 0.75 (previous day) to 0.45 (current hour), no holdout
  (an estimated speedup), so the drift run finds acceptance drift;
* ``translate``: low acceptance and expensive drafts: speculation is a net loss;
* ``summarize``: 12 requests only: insufficient data.

Then one real drift run (:func:`monitor.drift.run.run_drift`), and alerts plus webhook deliveries
written as the alerting side would (a firing, a pending, a resolved alert; delivered and dead), and a
drafter rollout as the scheduler's rollout job leaves it: at its second step, ``chat`` kept on the
current drafter, ``code`` passing (its judgements built by the judge's own classes).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import insert
from sqlalchemy.engine import Engine

from decoder.record import RequestRecord
from monitor.alerts.models import AlertRow
from monitor.drift.detectors.judge import MetricJudgement, WorkloadJudgement
from monitor.drift.run import run_drift
from monitor.notify.models import NotificationRow
from monitor.store.rollouts import Rollout, RolloutEvent, insert_rollout, record_event, save_rollout
from monitor.store.writes.writer import write_batch
from tests.drift.records import record, window_stream


def now_minute() -> datetime:
    return datetime.now(UTC).replace(second=0, microsecond=0)


def _records(now: datetime) -> list[RequestRecord]:
    day, hour, minute = timedelta(days=1), timedelta(hours=1), timedelta(minutes=1)
    out: list[RequestRecord] = []
    # Previous day (the Overview's reference window when the range is the last 24 hours).
    out += window_stream(now - 2 * day, now - day, 120, workload="code", alpha=0.85, seed=1)
    out += window_stream(now - 2 * day, now - day, 120, workload="chat", alpha=0.75, seed=2)
    out += window_stream(now - 2 * day, now - day, 60, workload="translate", alpha=0.3, seed=3)
    # Current day, most of it before the last hour (the drift run's reference window).
    new = {"draft_version": "d2"}
    out += window_stream(now - day + 30 * minute, now - hour, 150, workload="code", alpha=0.85, seed=4, **new)
    out += window_stream(now - hour, now, 120, workload="code", alpha=0.85, seed=5, **new)
    out += window_stream(now - day, now - hour, 150, workload="chat", alpha=0.75, seed=6)
    out += window_stream(now - hour, now, 120, workload="chat", alpha=0.45, seed=7)
    out += window_stream(now - day, now, 90, workload="translate", alpha=0.2, seed=8, ms_per_token=40.0)
    out += window_stream(now - day, now, 60, workload="code", alpha=0.5, seed=9, mode="holdout", ms_per_token=40.0)
    out += window_stream(now - 3 * hour, now, 12, workload="summarize", alpha=0.6, seed=10)
    # Draft cost dominates for translate: expensive drafts make the estimate fall below 1.
    out = [r if r.workload != "translate" or not r.draft_ms else _costly(r) for r in out]
    return sorted(out, key=lambda r: r.ts_start)


def _costly(rec: RequestRecord) -> RequestRecord:
    assert rec.latency_ms is not None
    return replace(rec, draft_ms=rec.latency_ms * 0.6, verify_ms=rec.latency_ms * 0.35)


def seed_records(engine: Engine, now: datetime) -> list[RequestRecord]:
    records = _records(now)
    with engine.begin() as conn:
        for start in range(0, len(records), 500):
            write_batch(conn, records[start : start + 500], f"dash-seed-{start}", "sync")
    return records


def seed_alerts(engine: Engine, now: datetime) -> None:
    base: dict[str, Any] = {
        "severity": "warning",
        "annotations": {},
        "episode": 1,
        "active_runs": 1,
        "clear_runs": 0,
        "value": None,
        "pending_since": now - timedelta(minutes=30),
        "fired_at": None,
        "resolved_at": None,
        "last_eval_at": now,
        "notified": False,
        "last_notified_at": None,
        "acked_at": None,
        "acked_by": None,
        "ack_comment": None,
        "fire_times": [],
        "created_at": now - timedelta(hours=2),
        "updated_at": now,
    }
    rows = [
        {
            **base,
            "fingerprint": "fp-chat-acceptance",
            "rule": "acceptance_drift",
            "severity": "critical",
            "labels": {"alertname": "acceptance_drift", "workload": "chat"},
            "annotations": {"summary": "chat acceptance fell by 30 points"},
            "state": "firing",
            "fired_at": now - timedelta(minutes=20),
            "notified": True,
        },
        {
            **base,
            "fingerprint": "fp-translate-netloss",
            "rule": "net_loss",
            "labels": {"alertname": "net_loss", "workload": "translate"},
            "annotations": {"summary": "speculation slower than plain"},
            "state": "pending",
        },
        {
            **base,
            "fingerprint": "fp-code-latency",
            "rule": "latency_regression",
            "labels": {"alertname": "latency_regression", "workload": "code"},
            "annotations": {"summary": "p95 ms per token up 20 %"},
            "state": "resolved",
            "fired_at": now - timedelta(hours=1),
            "resolved_at": now - timedelta(minutes=10),
        },
    ]
    deliveries = [
        {
            "notification_id": f"n-{status}",
            "receiver": "ops-slack",
            "format": "slack",
            "group_key": "workload=chat",
            "status": status,
            "body": "{}",
            "alerts": [{"id": 1, "status": "firing"}],
            "attempts": attempts,
            "created_at": now - timedelta(minutes=20),
            "next_attempt_at": now,
            "last_status": code,
            "last_error": error,
            "delivered_at": now - timedelta(minutes=19) if status == "delivered" else None,
        }
        for status, attempts, code, error in (("delivered", 1, 200, None), ("dead", 8, 500, "HTTP 500 from receiver"))
    ]
    with engine.begin() as conn:
        conn.execute(insert(AlertRow), rows)
        conn.execute(insert(NotificationRow), deliveries)


def _judgement(start: datetime, end: datetime, *workloads: WorkloadJudgement) -> dict[str, Any]:
    return {"interval": [start.isoformat(), end.isoformat()], "workloads": {j.workload: j.to_json() for j in workloads},
            "judged": sorted(j.workload for j in workloads if j.outcome == "pass")}  # fmt: skip


def seed_rollout(engine: Engine, now: datetime) -> None:
    started, step = now - timedelta(hours=2), now - timedelta(hours=1)
    code = WorkloadJudgement(
        "code", "pass", "decode_speed pass: 1.18x [1.09, 1.27]; error_rate pass: 0.0% against 0.0%; "
        "ttft pass: 1.01x [0.97, 1.05]", 100,
        (MetricJudgement("decode_speed", "pass", 8.5, 10.0, 1.18, (1.09, 1.27)),
         MetricJudgement("error_rate", "pass", 0.0, 0.0),
         MetricJudgement("ttft", "pass", 50.0, 50.5, 1.01, (0.97, 1.05)),
         MetricJudgement("acceptance", None, 0.81, 0.74)),
        42, 40,
    )  # fmt: skip
    chat = WorkloadJudgement(
        "chat", "fail", "decode_speed fail: 0.80x [0.72, 0.88]", 67,
        (MetricJudgement("decode_speed", "fail", 12.5, 10.0, 0.8, (0.72, 0.88)),
         MetricJudgement("error_rate", "pass", 0.0, 0.0),
         MetricJudgement("ttft", "pass", 50.0, 50.0, 1.0, (0.96, 1.04)),
         MetricJudgement("acceptance", None, 0.52, 0.61)),
        38, 41,
    )  # fmt: skip
    rollout = Rollout("*", "eagle3-v2", (0.05, 0.25, 0.5, 1.0), 3600.0, True, started, started,
                      reason="started: steps 5%, 25%, 50%, 100%, 3600 s a step")  # fmt: skip
    with engine.begin() as conn:
        rollout = insert_rollout(conn, rollout)
        rid = rollout.id
        assert rid is not None
        record_event(conn, RolloutEvent(rid, started, "started", 0, 0.05, rollout.reason))
        first = _judgement(started, started + timedelta(minutes=20), code, chat)
        rollout = replace(rollout, workloads={"chat": "current"}, judgement=first)
        reason = f"chat kept on the current drafter (failed): {chat.reason}"
        record_event(conn, RolloutEvent(rid, started + timedelta(minutes=20), "kept", 0, 0.05, reason, "chat", first))
        second = _judgement(started, step, code)
        rollout = replace(rollout, step=1, step_started_at=step, judgement=second)
        reason = "step 2 of 4: every judged workload passed (scores code 100)"
        record_event(conn, RolloutEvent(rid, step, "advanced", 1, 0.25, reason, None, second))
        rollout = replace(rollout, judgement=_judgement(step, now, code))
        save_rollout(conn, rollout)


def seed(engine: Engine, now: datetime | None = None) -> datetime:
    """Records, one drift run, alerts and a rollout; returns the ``now`` they are relative to."""
    now = now or now_minute()
    seed_records(engine, now)
    run_drift(engine, now=now + timedelta(minutes=1), detectors=False)
    seed_alerts(engine, now)
    seed_rollout(engine, now)
    return now


__all__ = ["now_minute", "record", "seed"]
