"""The Rollouts page (AppTest) on rollouts the scheduler's rollout job judged from stored records.

Two rollouts of the default deployment, run as tests/proxy/test_rollout.py runs them but on the
dashboard's clock: one rolled back on a losing workload, then one per workload that kept ``story``
on the current drafter and advanced to its second step on ``copy``. The page's figures are compared
with the stored rollout, its events and its judgements.
"""

from __future__ import annotations

import json
import math
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from streamlit.testing.v1 import AppTest

from monitor.proxy.rollout import advance_rollouts, start_rollout
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from monitor.store.rollouts import Rollout, RolloutEvent, get_rollout, rollout_events
from tests.dashboard.conftest import AppFactory
from tests.dashboard.seed import now_minute
from tests.proxy.test_rollout import INTERVAL, PROXY, interval_of, rollout_settings


def table_with(at: AppTest, column: str) -> list[dict[str, Any]]:
    (found,) = [e for e in at.dataframe if column in e.value.columns]
    return list(found.value.to_dict("records"))


def texts(at: AppTest) -> str:
    """The page's text as read (the Markdown escapes of ``_``, ``*``, ``[`` ... taken out)."""
    kinds = ("title", "markdown", "caption", "info", "warning", "error", "success")
    return "\n".join(str(getattr(e, "value", "")).replace("\\", "") for kind in kinds for e in at.get(kind))


def same(a: Any, b: Any) -> bool:
    if b is None:
        return a is None or (isinstance(a, float) and math.isnan(a))
    return a is not None and math.isclose(float(a), float(b), rel_tol=1e-9)


def metric(found: dict[str, Any], name: str) -> dict[str, Any]:
    return next((m for m in found["metrics"] if m["metric"] == name), {})


def judged_store(tmp_path: Path) -> tuple[str, Rollout, Rollout, list[RolloutEvent]]:
    url = f"sqlite:///{tmp_path / 'rollouts.db'}"
    engine = create_engine(url)
    upgrade(engine)
    start = now_minute() - timedelta(hours=3)
    lost = start_rollout(engine, PROXY, rollout_settings(), start)
    interval_of(engine, start, {"copy": (10.0, 7.0), "story": (10.0, 13.0)})
    (back,) = advance_rollouts(engine, rollout_settings(), start + timedelta(minutes=5, seconds=1))
    assert back.kind == "rolled_back"
    s = rollout_settings(per_workload=True)
    t = start + timedelta(hours=1)
    r = start_rollout(engine, PROXY, s, t)
    interval_of(engine, t, {"copy": (10.0, 7.0), "story": (10.0, 13.0)})
    assert [e.kind for e in advance_rollouts(engine, s, t + INTERVAL + timedelta(seconds=1))] == ["kept", "advanced"]
    assert r.id is not None and lost.id is not None
    running, rolled_back = get_rollout(engine, r.id), get_rollout(engine, lost.id)
    events = rollout_events(engine, rollout_id=r.id)
    engine.dispose()
    assert running is not None and rolled_back is not None
    return url, running, rolled_back, events


@pytest.fixture
def judged(tmp_path: Path) -> tuple[str, Rollout, Rollout, list[RolloutEvent]]:
    return judged_store(tmp_path)


def test_the_running_rollout_its_steps_and_candidate_against_current(
    app: AppFactory, judged: tuple[str, Rollout, Rollout, list[RolloutEvent]]
) -> None:
    url, r, _, events = judged
    at = app(url, "rollouts")
    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.title] == ["Rollouts"]
    # The active rollout is shown first, with where it stands and the newest event's reason.
    assert {m.label: m.value for m in at.metric} == {
        "Status": "🔵 running", "Step": "2 of 3", "Candidate's share": "50 %",
        "Started": f"{r.started_at:%b %d, %H:%M}",
    }  # fmt: skip
    assert events[-1].kind == "advanced" and events[-1].reason in texts(at)
    assert "Workloads decided: kept on the current drafter: story." in texts(at)
    # The steps: every event, in order, as stored.
    rows = table_with(at, "Event")
    assert [(row["Event"], row["Step"], row["Workload"], row["Reason"]) for row in rows] == [
        ({"kept": "kept on the current drafter"}.get(e.kind, e.kind), e.step + 1, e.workload or "", e.reason)
        for e in events
    ]
    assert [row["Share"] for row in rows] == [e.share for e in events] == [0.1, 0.1, 0.5]
    # Candidate against current: copy from the newest judgement, story from the judgement that kept it.
    shown = {row["Workload"]: row for row in table_with(at, "Decode speed")}
    assert set(shown) == {"copy", "story"}
    kept = next(e for e in events if e.kind == "kept")
    decided = {"copy": r.judgement["workloads"]["copy"], "story": kept.judgement["workloads"]["story"]}
    for workload, found in decided.items():
        row = shown[workload]
        speed, errors = metric(found, "decode_speed"), metric(found, "error_rate")
        ttft, acceptance = metric(found, "ttft"), metric(found, "acceptance")
        assert row["Score"] == found["score"] and row["Why"] == found["reason"], workload
        assert same(row["Decode speed"], speed["ratio"]) and row["Interval"] == "[{:.2f}, {:.2f}]".format(*speed["ci"])
        assert same(row["Candidate ms/token"], speed["candidate"]) and same(row["Current ms/token"], speed["current"])
        assert same(row["Candidate errors"], errors["candidate"]) and same(row["Current errors"], errors["current"])
        assert same(row["TTFT"], ttft["ratio"]) and same(row["Candidate TTFT ms"], ttft["candidate"])
        assert same(row["Candidate acceptance"], acceptance["candidate"])
        assert same(row["Current acceptance"], acceptance["current"])
        assert row["Requests (candidate / current)"] == f"{found['n_candidate']:,} / {found['n_current']:,}"
    assert shown["copy"]["Outcome"].endswith("pass") and shown["copy"]["Place"] == "judged step by step"
    assert shown["story"]["Outcome"].endswith("fail") and shown["story"]["Place"] == "kept on the current drafter"
    assert shown["copy"]["Decode speed"] > 1.2 > 1 > shown["story"]["Decode speed"]  # 10 ms / 7, 10 ms / 13
    # Two charts: the steps on a timeline (with "now"), the decode speed per workload with its interval.
    timeline, speeds = at.get("vega_lite_chart")
    points = pa.ipc.open_stream(timeline.proto.data.data).read_all().to_pylist()
    assert [(p["event"], p["share"], p["text"]) for p in points[:-1]] == [(e.kind, e.share, e.reason) for e in events]
    assert points[-1]["event"] == "now" and points[-1]["share"] == 0.5
    speeds = json.loads(speeds.proto.spec)
    assert "story" in json.dumps(speeds) and "copy" in json.dumps(speeds)


def test_a_rolled_back_rollout_shows_why(
    app: AppFactory, judged: tuple[str, Rollout, Rollout, list[RolloutEvent]]
) -> None:
    url, _, back, _ = judged
    at = app(url, "rollouts")
    next(s for s in at.selectbox if s.label == "Rollout").select(back.id).run()
    assert not at.exception, [e.value for e in at.exception]
    assert {m.label: m.value for m in at.metric}["Status"] == "🔴 rolled back"
    (error,) = at.error
    shown = error.value.replace("\\", "")
    assert back.reason in shown and "story: decode_speed fail" in shown
    rows = table_with(at, "Decode speed")
    assert {row["Workload"]: row["Outcome"][-4:] for row in rows} == {"copy": "pass", "story": "fail"}
