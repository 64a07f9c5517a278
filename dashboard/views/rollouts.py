"""Rollouts: a candidate drafter staged on live traffic (``draftwatch rollout start``), where it stands and why,
its steps on a timeline, and the judge's newest judgement per workload, candidate against current drafter."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

import streamlit as st

from dashboard import charts, components, data
from dashboard.components import Filters
from monitor.store.rollouts import Rollout, RolloutEvent

st.title("Rollouts")
st.caption(
    "A rollout sends a rising share of a deployment's speculative requests to a candidate drafter (its candidate "
    "pool, proxy.candidate_upstream). The scheduler judges each step per workload against the current drafter's "
    "requests of the same step, then advances it, holds it, promotes the candidate or rolls it back."
)

ROLLOUT_KEY: Final = "dw_rollout"
STATUS_LABEL: Final = {
    "running": "🔵 running", "promoted": "🟢 promoted", "rolled_back": "🔴 rolled back", "aborted": "⚪ aborted",
}  # fmt: skip
OUTCOME_LABEL: Final = {"pass": "🟢 pass", "marginal": "🟠 marginal", "fail": "🔴 fail", "unjudged": "⚪ unjudged"}
EVENT_LABEL: Final = {
    "started": "started", "advanced": "advanced", "held": "held", "kept": "kept on the current drafter",
    "rolled_back": "rolled back", "promoted": "promoted", "aborted": "aborted",
}  # fmt: skip
PLACE_LABEL: Final = {"candidate": "on the candidate", "current": "kept on the current drafter"}
NO_ROLLOUTS: Final = (
    "**No rollouts yet.** `draftwatch rollout start` stages a candidate drafter on a deployment that has a "
    "candidate pool (proxy.candidate_upstream); its steps and the judge's findings show here."
)
COLUMNS: Final = {
    "Score": st.column_config.NumberColumn(format="%d", help="share of the judged metrics the candidate passed, 0-100"),
    "Decode speed": st.column_config.NumberColumn(
        format="%.2f×", help="the current drafter's decode ms per token over the candidate's (critical; >1: faster)"
    ),
    "Candidate ms/token": st.column_config.NumberColumn(format="%.2f"),
    "Current ms/token": st.column_config.NumberColumn(format="%.2f"),
    "Candidate errors": st.column_config.NumberColumn(format="percent", help="failed requests per request (critical)"),
    "Current errors": st.column_config.NumberColumn(format="percent"),
    "TTFT": st.column_config.NumberColumn(
        format="%.2f×", help="the current drafter's mean time to first token over the candidate's (judged)"
    ),
    "Candidate TTFT ms": st.column_config.NumberColumn(format="%.1f"),
    "Current TTFT ms": st.column_config.NumberColumn(format="%.1f"),
    "Candidate acceptance": st.column_config.NumberColumn(format="percent", help="accepted per drafted token (shown)"),
    "Current acceptance": st.column_config.NumberColumn(format="percent"),
}
EVENT_COLUMNS: Final = {"Share": st.column_config.NumberColumn(format="percent")}


def _pick(found: Sequence[Rollout]) -> Rollout:
    """The rollout a link names (``?rollout=7``), else the previous choice, else the newest active one, else the
    newest."""
    by_id = {r.id: r for r in found if r.id is not None}
    ids = list(by_id)
    wanted = str(st.query_params.get("rollout") or st.session_state.get(ROLLOUT_KEY) or "")
    first = next((i for i, r in by_id.items() if r.active), ids[0])
    chosen = int(wanted) if wanted.isdigit() and int(wanted) in by_id else first

    def label(i: int) -> str:
        return f"{i}: {by_id[i].drafter} on {by_id[i].deployment} ({STATUS_LABEL[by_id[i].status]})"

    choice = st.selectbox("Rollout", ids, index=ids.index(chosen), format_func=label)
    st.session_state[ROLLOUT_KEY] = choice
    return by_id[int(choice)]


def _status(r: Rollout, events: Sequence[RolloutEvent]) -> None:
    a, b, c, d = st.columns(4)
    a.metric("Status", STATUS_LABEL[r.status])
    b.metric("Step", f"{r.step + 1} of {len(r.steps)}")
    c.metric("Candidate's share", components.pct(r.step_share, 0))
    d.metric("Started", f"{r.started_at:%b %d, %H:%M}", help=f"{r.started_at:%Y-%m-%d %H:%M:%S} UTC")
    last = events[-1] if events else None
    reason = last.reason if last is not None and r.status == "running" else r.reason
    when = f" ({EVENT_LABEL[last.kind]}, {last.ts:%Y-%m-%d %H:%M} UTC)" if last is not None else ""
    text = f"**{STATUS_LABEL[r.status]}**{when}: {_plain(reason)}"
    show = {"rolled_back": st.error, "promoted": st.success, "aborted": st.warning}.get(r.status, st.info)
    show(text)
    steps = ", ".join(f"{100 * s:g} %" for s in r.steps)
    places = "; ".join(
        f"{PLACE_LABEL[side]}: {_plain(', '.join(sorted(w for w, s in r.workloads.items() if s == side)))}"
        for side in ("candidate", "current")
        if side in r.workloads.values()
    )
    decided = f" Workloads decided: {places}." if places else ""
    per_workload = ", decided per workload" if r.per_workload else ""
    st.caption(
        f"Candidate drafter **{r.drafter}** on deployment {_plain(r.deployment)}: steps {steps}, {r.interval_s:g} s "
        "each"
        f"{per_workload}.{decided}"
    )


def _plain(text: str) -> str:
    """``text`` shown as it is in Markdown (a deployment is a model glob: ``*``, ``qwen*``)."""
    return "".join(f"\\{c}" if c in "\\`*_[]<>#|~" else c for c in text)


def _timeline(r: Rollout, events: Sequence[RolloutEvent]) -> None:
    st.subheader("Steps")
    rows = [
        {"ts": e.ts.isoformat(), "share": e.share, "event": e.kind, "step": e.step + 1, "text": e.reason}
        for e in events
    ]
    if rows and r.active:
        now = max(datetime.now(UTC), events[-1].ts)
        rows.append({"ts": now.isoformat(), "share": r.step_share, "event": "now", "step": r.step + 1, "text": ""})
    if rows:
        st.altair_chart(charts.rollout_timeline(rows), width="stretch")
    st.dataframe(
        [
            {
                "When": f"{e.ts:%Y-%m-%d %H:%M:%S} UTC",
                "Event": EVENT_LABEL[e.kind],
                "Step": e.step + 1,
                "Share": e.share,
                "Workload": e.workload or "",
                "Reason": e.reason,
            }
            for e in events
        ],
        hide_index=True,
        column_config=EVENT_COLUMNS,
        key="rollout_events_table",
        placeholder=components.MISSING,
    )


def _metric(found: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    return next((m for m in found.get("metrics", ()) if m.get("metric") == name), {})


def judged(r: Rollout, events: Sequence[RolloutEvent]) -> dict[str, tuple[Mapping[str, Any], str]]:
    """Per workload, its newest judgement and the interval's end: the rollout's newest judgement, and for a workload
    decided earlier (kept on the current drafter, no longer judged) the judgement of the event that decided it."""
    out: dict[str, tuple[Mapping[str, Any], str]] = {}
    for judgement in [r.judgement, *(e.judgement for e in reversed(events))]:
        interval = judgement.get("interval") or ["", ""]
        for workload, found in judgement.get("workloads", {}).items():
            if workload not in out and (judgement is r.judgement or workload in r.workloads):
                out[workload] = (found, str(interval[-1]))
    return out


def judgement_rows(f: Filters, r: Rollout, events: Sequence[RolloutEvent]) -> list[dict[str, Any]]:
    """One row per workload: outcome and score, then each metric, candidate against current drafter.

    A workload with live records follows the sidebar's filter; one without (an older rollout's) always shows.
    """
    rows = []
    for workload, (found, until) in sorted(judged(r, events).items()):
        if workload in f.available and not f.shows(workload):
            continue
        speed, errors = _metric(found, "decode_speed"), _metric(found, "error_rate")
        ttft, acceptance = _metric(found, "ttft"), _metric(found, "acceptance")
        ci = speed.get("ci")
        rows.append(
            {
                "Workload": workload,
                "Place": PLACE_LABEL.get(str(r.workloads.get(workload)), "judged step by step"),
                "Outcome": OUTCOME_LABEL.get(str(found.get("outcome")), str(found.get("outcome"))),
                "Score": found.get("score"),
                "Decode speed": speed.get("ratio"),
                "Interval": f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else components.MISSING,
                "Candidate ms/token": speed.get("candidate"),
                "Current ms/token": speed.get("current"),
                "Candidate errors": errors.get("candidate"),
                "Current errors": errors.get("current"),
                "TTFT": ttft.get("ratio"),
                "Candidate TTFT ms": ttft.get("candidate"),
                "Current TTFT ms": ttft.get("current"),
                "Candidate acceptance": acceptance.get("candidate"),
                "Current acceptance": acceptance.get("current"),
                "Requests (candidate / current)": f"{found.get('n_candidate', 0):,} / {found.get('n_current', 0):,}",
                "Why": found.get("reason", ""),
                "Judged until": _when(until),
            }
        )
    return rows


def _when(iso: str) -> str:
    try:
        return f"{datetime.fromisoformat(iso):%Y-%m-%d %H:%M} UTC"
    except ValueError:
        return components.MISSING


def _judgement(f: Filters, r: Rollout, events: Sequence[RolloutEvent]) -> None:
    st.subheader("Candidate against current drafter")
    rows = judgement_rows(f, r, events)
    if not rows:
        st.info(
            "Not judged yet: the scheduler's rollout job judges the step every scheduler.rollout_interval, per "
            "workload with requests on both drafters."
        )
        return
    st.dataframe(rows, hide_index=True, column_config=COLUMNS, key="rollout_judgement_table",
                 placeholder=components.MISSING)  # fmt: skip
    decisions = judged(r, events)
    speeds = []
    for row in rows:
        speed = _metric(decisions[row["Workload"]][0], "decode_speed")
        if speed.get("ratio") is not None and speed.get("ci"):
            speeds.append({"workload": row["Workload"], "ratio": speed["ratio"], "ci_low": speed["ci"][0],
                           "ci_high": speed["ci"][1], "outcome": speed.get("outcome")})  # fmt: skip
    if speeds:
        st.altair_chart(charts.rollout_speed(speeds), width="stretch")
    interval = r.judgement.get("interval") or ["", ""]
    st.caption(
        f"Newest judgement: {_when(str(interval[0]))} – {_when(str(interval[-1]))}, the current step so far. Decode "
        "speed and the error rate are critical (a fail rolls the rollout back, or per workload keeps the workload on "
        "the current drafter), TTFT is judged, acceptance is shown; the score is the share of judged metrics that "
        "pass. Decode speed is compared like for like by load and context length, with its interval."
    )


def body(f: Filters) -> None:
    found = data.rollouts(f.url)
    if not found:
        st.info(NO_ROLLOUTS, icon=":material/inbox:")
        return
    r = _pick(found)
    assert r.id is not None
    events = data.rollout_events(f.url, r.id)
    _status(r, events)
    _timeline(r, events)
    _judgement(f, r, events)


components.live(body)
