"""AppTest runs of every page against a real seeded SQLite store (and an empty one).

The figures a page shows are compared with the monitor's own aggregates over the same range, the
sidebar filters are exercised, and admin actions (acknowledge, silence) are checked in the database.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from dashboard.timerange import DEFAULT_RANGE, time_range
from monitor.alerts.queries import list_alerts
from monitor.alerts.silences import list_silences
from monitor.drift.queries import latest_results, latest_run
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from monitor.store.reads import queries
from tests.dashboard.conftest import PAGES, AppFactory, Store
from tests.dashboard.seed import seed


def close(a: Any, b: Any) -> bool:
    if a is None or (isinstance(a, float) and math.isnan(a)):
        return b is None
    return b is not None and math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)


def table(at: AppTest, key: str) -> list[dict[str, Any]]:
    frame = at.get("arrow_data_frame")
    for element in frame:
        if getattr(element, "proto", None) is not None and key in element.proto.id:
            return list(element.value.to_dict("records"))
    found = [e for e in at.dataframe]
    assert found, "no table on the page"
    return list(found[0].value.to_dict("records"))


def table_with(at: AppTest, column: str) -> list[dict[str, Any]]:
    """The rows of the page's table that has ``column`` (a page can show several)."""
    (found,) = [e for e in at.dataframe if column in e.value.columns]
    return list(found.value.to_dict("records"))


def texts(at: AppTest) -> str:
    parts = [e.value for kind in ("title", "markdown", "caption", "info", "warning", "error") for e in at.get(kind)]
    return "\n".join(str(p) for p in parts)


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_without_exception(app: AppFactory, seeded_store: Store, page: str) -> None:
    at = app(seeded_store.url, page)
    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.title] == [page.capitalize()]
    assert "Traceback" not in texts(at)


def _overview_rows(app: AppFactory, store: Store) -> tuple[list[dict[str, Any]], list[queries.WorkloadSummary]]:
    # The range ends with the current minute: retry if the minute turned between the page and the query.
    for _ in range(3):
        before = time_range(DEFAULT_RANGE)
        at = app(store.url, "overview")
        window = time_range(DEFAULT_RANGE)
        if before == window:
            return table(at, "overview_table"), queries.workload_summaries(store.engine, window.start, window.end)
    raise AssertionError("the minute kept turning")


def test_overview_figures_equal_the_monitor_aggregates(app: AppFactory, seeded_store: Store) -> None:
    rows, summaries = _overview_rows(app, seeded_store)
    names = [s.workload for s in summaries]
    assert [r["Workload"] for r in rows] == names == ["chat", "code", "summarize", "translate"]
    for row, s in zip(rows, summaries, strict=True):
        assert row["Requests"] == s.requests
        assert close(row["Acceptance"], s.acceptance_rate_tokens)
        assert close(row["Mean accept. length"], s.mean_acceptance_length)
        assert close(row["p95 ms/token"], s.ms_per_token_p95)
    by_name = {r["Workload"]: r for r in rows}
    code = next(s for s in summaries if s.workload == "code")
    assert by_name["code"]["Speedup is"] == "measured" and close(by_name["code"]["Speedup"], code.measured_speedup)
    # chat has no holdout: its figure is the drift run's, against the target's plain decoding.
    (chat_net_loss,) = latest_results(seeded_store.engine, workload="chat", test="net_loss")
    assert by_name["chat"]["Speedup is"] == "estimated (drift run)"
    assert close(by_name["chat"]["Speedup"], chat_net_loss.result.effect)
    # The seeded story: chat drifted, translate loses, summarize is too small to judge.
    assert by_name["chat"]["Status"].endswith("drift")
    assert by_name["translate"]["Status"].endswith("net loss") and by_name["translate"]["Speedup"] < 1
    assert by_name["summarize"]["Status"].endswith("insufficient data")
    assert by_name["code"]["Status"].endswith("ok")


def test_overview_shows_the_firing_alerts_banner(app: AppFactory, seeded_store: Store) -> None:
    at = app(seeded_store.url, "overview")
    banner = [e.value for e in at.error]
    assert len(banner) == 1 and "1 alert(s) firing" in banner[0] and "acceptance_drift" in banner[0]


def test_workload_filter_and_time_range_change_what_is_shown(app: AppFactory, seeded_store: Store) -> None:
    at = app(seeded_store.url, "overview")
    at.sidebar.multiselect(key="dw_workloads").select("chat").select("translate").run()
    assert [r["Workload"] for r in table(at, "overview_table")] == ["chat", "translate"]
    at.sidebar.selectbox(key="dw_range").select("Last 1 hour").run()
    window = time_range("Last 1 hour")
    chat = queries.workload_summary(seeded_store.engine, "chat", window.start, window.end)
    rows = {r["Workload"]: r for r in table(at, "overview_table")}
    assert chat is not None and rows["chat"]["Requests"] == chat.requests < 200
    # The filter carries over to the other pages.
    at.switch_page("views/pairs.py").run()
    assert {r["Workload"] for r in table(at, "pairs_table")} == {"chat", "translate"}


def test_workload_page_figures_and_charts(app: AppFactory, seeded_store: Store) -> None:
    at = app(seeded_store.url, "workload")
    selector = next(s for s in at.selectbox if s.label == "Workload")
    selector.select("code").run()
    window = time_range(DEFAULT_RANGE)
    s = queries.workload_summary(seeded_store.engine, "code", window.start, window.end)
    assert s is not None
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Requests"] == f"{s.requests:,}"
    assert metrics["Mean acceptance length"] == f"{s.mean_acceptance_length:.2f}"
    assert metrics["p95 ms / token"] == f"{s.ms_per_token_p95:.2f}"
    charts = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]
    # acceptance, per position, length histogram, by prompt length, by output position, latency, TTFT, what-if γ
    assert len(charts) == 8
    # The version change of the draft model (d1 -> d2) is marked on the acceptance chart.
    assert "draft qwen-coder-0.5b d2 (version_changed)" in json.dumps(charts[0])
    caption = next(c.value for c in at.caption if c.value.startswith("Expected speedup"))
    assert "Current γ = 4" in caption


def test_drift_page_shows_why_acceptance_changed(app: AppFactory, seeded_store: Store) -> None:
    """The latest run's stored split: its sentence, and a waterfall of its parts."""
    run = latest_run(seeded_store.engine)
    assert run is not None and run.acceptance_split is not None
    assert run.acceptance_split["parts"] and "rate_ref" in run.acceptance_split["detail"]
    at = app(seeded_store.url, "drift")
    assert not at.exception
    assert "Why acceptance changed" in [s.value for s in at.subheader]
    assert run.acceptance_split["detail"]["summary"] in texts(at)
    # The chart's rows are dashboard.charts.waterfall_rows (its doctest); here, that the page draws it.
    specs = [c.proto.spec for c in at.get("vega_lite_chart")]
    # A workload tested over windows of its own (here: current windows widened at low volume) is split over
    # those too: its sentence, and its waterfall where a part of it is named.
    own = run.acceptance_split["workloads"]
    assert own and all(o["detail"]["summary"] in texts(at) and o["note"] in texts(at) for o in own.values())
    waterfalls = 1 + sum(any(p["detail"]["named"] for p in o["parts"]) for o in own.values())
    acceptance = [spec for spec in specs if '"field": "named"' in spec and '"title": "acceptance"' in spec]
    assert len(acceptance) == waterfalls
    # The split of decode speed beside it, drawn the same way.
    speed = run.speed_split
    assert speed is not None and speed["metric"] == "ms_per_token"
    assert "Why decode speed changed" in [s.value for s in at.subheader] and speed["detail"]["summary"] in texts(at)
    waterfalls = 1 + sum(any(p["detail"]["named"] for p in o["parts"]) for o in speed["workloads"].values())
    assert sum('"title": "decode ms per token"' in spec for spec in specs) == waterfalls
    # And the runs' splits over time: the seeded store's one run, its change a point beside its parts.
    assert sum('"field": "part"' in spec and '"field": "change"' in spec for spec in specs) == 1


def test_drift_page_lists_the_latest_run_and_filters(app: AppFactory, seeded_store: Store) -> None:
    at = app(seeded_store.url, "drift")
    stored = latest_results(seeded_store.engine)
    rows = table(at, "drift_table")
    assert len(rows) == len(stored)
    assert any(r["Decision"].endswith("insufficient data") and r["Workload"] == "summarize" for r in rows)
    at.multiselect(key="dw_drift_decisions").select("drift").run()
    drifted = table(at, "drift_table")
    assert drifted and len(drifted) == sum(s.result.decision == "drift" for s in stored)
    assert {r["Workload"] for r in drifted} >= {"chat"}
    chat = next(r for r in drifted if r["Test"] == "acceptance")
    ref = next(s.result for s in stored if s.result.workload == "chat" and s.result.test == "acceptance")
    assert close(chat["q"], ref.q) and close(chat["Effect"], ref.effect) and close(chat["CI low"], ref.ci and ref.ci[0])


def test_alerts_page_acknowledges_and_silences(app: AppFactory, seeded_store: Store) -> None:
    at = app(seeded_store.url, "alerts")
    assert {m.label: m.value for m in at.metric} == {"🔴 firing": "1", "🟠 pending": "1", "🟢 resolved": "1"}
    assert "dead letter" in texts(at)
    at.text_input(key="dw_ack_by").input("ada")
    at.text_input(key="dw_ack_comment").input("looking")
    at.button(key="dw_ack_submit").click().run()
    assert not at.exception
    acked = [a for a in list_alerts(seeded_store.engine) if a.acked_at is not None]
    assert len(acked) == 1 and acked[0].acked_by == "ada" and acked[0].ack_comment == "looking"
    at.selectbox(key="dw_sil_workload").select("chat")
    at.text_input(key="dw_sil_by").input("ada")
    at.text_input(key="dw_sil_comment").input("known: new prompt style")
    at.button(key="dw_sil_submit").click().run()
    assert not at.exception
    silences = list_silences(seeded_store.engine, seeded_store.now or acked[0].last_eval_at)
    assert any(m.name == "workload" and m.value == "chat" for s in silences for m in s.matchers)


@pytest.mark.parametrize("page", PAGES)
def test_empty_store_shows_what_to_do(app: AppFactory, empty_store: Store, page: str) -> None:
    at = app(empty_store.url, page)
    assert not at.exception
    shown = texts(at)
    if page == "alerts":
        assert "No alerts" in shown
    elif page == "rollouts":
        assert "No rollouts yet" in shown and "draftwatch rollout start" in shown
    else:
        assert "No records yet" in shown and "draftwatch demo" in shown and "/v1/events" in shown


def test_password_login(monkeypatch: pytest.MonkeyPatch, seeded_store: Store) -> None:
    from tests.dashboard.conftest import APP

    monkeypatch.setenv("DRAFTWATCH_DATABASE_URL", seeded_store.url)
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.secrets["draftwatch"] = {"password": "viewer-pw", "admin_password": "admin-pw"}
    at.run()
    assert not at.dataframe and [t.value for t in at.title] == ["draftwatch"]
    at.text_input[0].input("wrong")
    at.button[0].click().run()
    assert any("Wrong password" in e.value for e in at.error)
    at.text_input[0].input("viewer-pw")
    at.button[0].click().run()
    assert [t.value for t in at.title] == ["Overview"]
    at.switch_page("views/alerts.py").run()
    assert "needs an admin login" in texts(at)


def test_overview_marks_scraped_engines_apart_even_without_request_records(
    app: AppFactory, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import insert

    from monitor.store.engine import create_engine
    from monitor.store.migrate import upgrade
    from monitor.store.scrape import ScrapeIntervalRow, ScrapeTargetRow

    url = f"sqlite:///{tmp_path_factory.mktemp('dash') / 'scraped.db'}"
    engine = create_engine(url)
    upgrade(engine)
    end = datetime.now(UTC) - timedelta(minutes=2)
    with engine.begin() as conn:
        conn.execute(insert(ScrapeIntervalRow).values(
            target="vllm-a", kind="vllm", workload="chat", target_model="llama-8b", drafter="eagle",
            started_at=end - timedelta(seconds=30), ended_at=end, drafts=100, draft_tokens=300,
            accepted_tokens=210, accepted_per_position=[100, 70, 40], reset=False,
        ))  # fmt: skip
        conn.execute(insert(ScrapeTargetRow).values(
            name="vllm-a", kind="vllm", status="down", error="HTTP 503", failures=1, scraped_at=end, up_at=end,
            counters={}, resets=0,
        ))  # fmt: skip
    engine.dispose()
    at = app(url, "overview")
    assert not at.exception
    (row,) = table(at, "scraped_table")
    assert (row["Source"], row["Workload"], row["Intervals"], row["Drafted"]) == ("scrape:vllm-a", "chat", 1, 300)
    assert close(row["Acceptance"], 0.7) and close(row["Mean accept. length"], 3.1)
    assert "vllm-a: down (HTTP 503)" in texts(at) and "No records yet" in texts(at)


def test_pairs_page_shows_the_latest_stored_evaluations(app: AppFactory, tmp_path: Path) -> None:
    from monitor.store.evaluations import save_evaluation

    url = f"sqlite:///{tmp_path / 'evaluated.db'}"
    engine = create_engine(url)
    upgrade(engine)
    seed(engine)

    def verdict(workload: str, measured: float) -> dict[str, Any]:
        candidate = {"drafter": "ngram", "predicted_speedup": 1.3, "measured_speedup": measured, "gamma": 4,
                     "acceptance": 0.7}  # fmt: skip
        return {"workload": workload, "candidates": [candidate], "recommendation": "ngram",
                "recommendation_matches": True}  # fmt: skip

    earlier = datetime.now(UTC) - timedelta(hours=2)
    save_evaluation(engine, [verdict("chat", 1.1), verdict("summarise", 0.9)], target_model="t-old",
                    target_version=None, sample="old.jsonl", ran_at=earlier)  # fmt: skip
    save_evaluation(engine, [verdict("chat", 1.25)], target_model="t-old", target_version=None, sample="new.jsonl",
                    ran_at=earlier + timedelta(hours=1))  # fmt: skip
    engine.dispose()
    at = app(url, "pairs")
    assert not at.exception
    rows = {r["Workload"]: r for r in table_with(at, "Candidate")}
    assert set(rows) == {"chat", "summarise"}  # summarise has no live records: shown before it serves
    assert (rows["chat"]["Measured"], rows["chat"]["Sample"]) == (1.25, "new.jsonl")  # the newer run
    assert rows["chat"]["Recommended"] == "yes"
    at.sidebar.multiselect(key="dw_workloads").select("translate").run()
    assert {r["Workload"] for r in table_with(at, "Candidate")} == {"summarise"}  # chat is filtered out
