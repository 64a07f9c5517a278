"""Drift: the latest run's results (filterable, with p, q, effect and interval) and a test's history."""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboard import charts, components, data
from dashboard.components import Filters
from monitor.drift.queries import StoredResult

st.title("Drift")
st.caption(
    "Each drift run compares a reference window with the current one per workload and pair. A finding needs "
    "both a q-value (Benjamini–Hochberg across the run) below the level and an effect past its floor; too few "
    "requests give *insufficient data*, never *no drift*."
)

DECISION_LABEL = {"drift": "🔴 drift", "no_drift": "🟢 no drift", "insufficient_data": "⚪ insufficient data"}
COLUMNS = {
    "p": st.column_config.NumberColumn(format="%.3g"),
    "q": st.column_config.NumberColumn(format="%.3g", help="Benjamini–Hochberg adjusted across the run"),
    "Statistic": st.column_config.NumberColumn(format="%.3g"),
    "Effect": st.column_config.NumberColumn(format="%.3g"),
    "CI low": st.column_config.NumberColumn(format="%.3g"),
    "CI high": st.column_config.NumberColumn(format="%.3g"),
}


def table(results: list[StoredResult]) -> list[dict[str, Any]]:
    return [
        {
            "Workload": r.workload or "(all)",
            "Pair": r.pair or "—",
            "Test": r.test,
            "Metric": r.metric,
            "Decision": DECISION_LABEL.get(r.decision, r.decision),
            "n ref": r.n_ref,
            "n cur": r.n_cur,
            "Statistic": r.statistic,
            "p": r.p,
            "q": r.q,
            "Effect": r.effect,
            "CI low": r.ci[0] if r.ci else None,
            "CI high": r.ci[1] if r.ci else None,
            "Note": r.note or "",
        }
        for r in (s.result for s in results)
    ]


def _history(f: Filters, latest: list[StoredResult]) -> None:
    st.subheader("History per workload")
    workloads = sorted({s.result.workload for s in latest if s.result.workload and f.shows(s.result.workload)})
    if not workloads:
        st.info("No per-workload results in the latest run.")
        return
    left, right = st.columns(2)
    workload = left.selectbox("Workload", workloads, key="dw_drift_workload")
    tests = sorted({(s.result.test, s.result.metric) for s in latest if s.result.workload == workload})
    test, metric = right.selectbox("Test", tests, format_func=lambda t: f"{t[0]}: {t[1]}", key="dw_drift_test")
    history = [
        s
        for s in data.drift_history(f.url, f.range.start, f.range.end, workload, None, test)
        if s.result.metric == metric
    ]
    rows = [
        {
            "created_at": s.created_at.isoformat(),
            "metric": s.result.metric,
            "effect": s.result.effect,
            "ci_low": s.result.ci[0] if s.result.ci else s.result.effect,
            "ci_high": s.result.ci[1] if s.result.ci else s.result.effect,
            "q": s.result.q,
            "decision": s.result.decision,
        }
        for s in history
        if s.result.effect is not None
    ]
    if rows:
        st.altair_chart(charts.effect_history(rows), width="stretch")
    st.caption(f"{len(history)} run(s) in {f.range.label()}.")
    st.dataframe(
        table(history),
        hide_index=True,
        column_config=COLUMNS,
        key="drift_history_table",
        placeholder=components.MISSING,
    )


def body(f: Filters) -> None:
    run = data.latest_drift_run(f.url)
    if run is None:
        if not components.empty_state(f):
            st.info(
                "No drift run yet: run `draftwatch drift run`, or start `draftwatch serve` (or `draftwatch "
                "scheduler`), which runs the tests on a schedule.",
                icon=":material/inbox:",
            )
        return
    latest = [s for s in data.latest_drift_results(f.url) if f.shows(s.result.workload)]
    st.markdown(
        f"Latest run **{run.run_id[:8]}** at {run.started_at:%Y-%m-%d %H:%M:%S} UTC: {run.n_results} results, "
        f"**{run.n_drift} drift**, level {run.level:g}."
    )
    left, right = st.columns(2)
    decisions = left.multiselect(
        "Decision", list(DECISION_LABEL), format_func=DECISION_LABEL.__getitem__, key="dw_drift_decisions",
        placeholder="all decisions",
    )  # fmt: skip
    tests = right.multiselect(
        "Test", sorted({s.result.test for s in latest}), key="dw_drift_tests", placeholder="all tests"
    )
    shown = [
        s for s in latest if (not decisions or s.result.decision in decisions) and (not tests or s.result.test in tests)
    ]
    st.dataframe(
        table(shown), hide_index=True, column_config=COLUMNS, key="drift_table", placeholder=components.MISSING
    )
    _split(run.acceptance_split, f)
    _speed_split(run.speed_split, f)
    _history(f, latest)


def _split(split: dict[str, Any] | None, f: Filters) -> None:
    st.subheader("Why acceptance changed")
    if split is None:
        st.info("This run kept no acceptance split (it was stored before draftwatch kept them).")
        return
    _waterfalls(split, f, "acceptance")
    history = data.split_history(f.url, f.range.start, f.range.end)
    over_time = charts.split_over_time_rows(history)
    if over_time:
        st.altair_chart(charts.split_over_time(over_time), width="stretch")
    st.caption(
        "From the reference window's acceptance to the current one's: the mix between workloads, each workload's "
        "own change (split by length, sampling, style, content, version and health where it is named), the rest "
        "unexplained. Red parts are named (q below the run's level, interval clear of zero, at least 0.01); the "
        "rules are their 95 % intervals. The second chart has each run in the range: its change as a point, its named "
        "parts stacked. "
        "`draftwatch drift explain` prints the latest split."
    )


def _speed_split(split: dict[str, Any] | None, f: Filters) -> None:
    if split is None:
        return  # a run stored before draftwatch kept it
    st.subheader("Why decode speed changed")
    _waterfalls(split, f, "decode ms per token")
    st.caption(
        "The same split of the speculative requests' decode time per token (ms over output tokens after the first), "
        "its shares of decode tokens; inside a workload the load (requests in flight at the engine) and the "
        "requests' own acceptance are causes too. A part is named from 1 % of the reference's ms per token. "
        "`draftwatch drift explain --metric speed` prints it."
    )


def _waterfalls(split: dict[str, Any], f: Filters, title: str) -> None:
    """The run's split (sentence and waterfall), then each workload's over windows of its own."""
    st.markdown(split["detail"]["summary"])
    shown = {**split, "parts": [p for p in split["parts"] if p["workload"] is None or f.shows(p["workload"])]}
    rows = charts.waterfall_rows(shown)
    if rows:
        st.altair_chart(charts.split_waterfall(rows, title), width="stretch", key=f"dw_split_{title}")
    # A workload tested over windows of its own (a pinned baseline, a version change) is split over those too.
    for workload, own in split.get("workloads", {}).items():
        if not f.shows(workload):
            continue
        st.markdown(f"**{workload}** over its own windows ({own['note']}): {own['detail']['summary']}")
        rows = charts.waterfall_rows(own)
        if any(p["detail"].get("named") for p in own["parts"]):
            chart = charts.split_waterfall(rows, title)
            st.altair_chart(chart, width="stretch", key=f"dw_split_{title}_{workload}")


components.live(body)
