"""Pairs: every target/drafter pair side by side per workload (acceptance, speedup, latency)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import streamlit as st

from dashboard import charts, components, data
from dashboard.components import Filters
from dashboard.status import MIN_REQUESTS, VERDICT_LABELS
from monitor.drift.verdict import NOT_TESTED, Verdict, verdict_of
from monitor.store.evaluations import StoredEvaluation
from monitor.store.reads.dashboard import PairSummary

st.title("Pairs")
st.caption("Drafters and target/draft pairs side by side per workload, for choosing a pairing.")

COLUMNS = {
    "Requests": st.column_config.NumberColumn(format="localized"),
    "Acceptance": st.column_config.NumberColumn(format="percent", help="accepted / drafted tokens"),
    "Mean accept. length": st.column_config.NumberColumn(format="%.2f"),
    "Speedup": st.column_config.NumberColumn(
        format="%.2f×", help="measured against the workload's holdout traffic, else estimated (Leviathan et al.)"
    ),
    "ms/token": st.column_config.NumberColumn(format="%.2f", help="mean ms per output token"),
    "p95 ms/token": st.column_config.NumberColumn(format="%.2f"),
    "tokens/s": st.column_config.NumberColumn(format="%.1f"),
}


def rows_of(f: Filters, found: list[PairSummary]) -> list[dict[str, Any]]:
    """One row per workload and speculating pair; the speedup's baseline is the workload's holdout."""
    holdout: dict[tuple[str, str], list[PairSummary]] = defaultdict(list)
    for s in found:
        if s.mode in ("holdout", "plain"):
            holdout[(s.workload, s.pair.target_model)].append(s)
    verdicts = {
        (r.result.workload, r.result.pair): verdict_of(r.result)
        for r in data.latest_drift_results(f.url)
        if r.result.test == "net_loss"
    }
    rows = []
    for s in found:
        if s.mode != "speculative" or not f.shows(s.workload):
            continue
        base = holdout.get((s.workload, s.pair.target_model), [])
        base_n = sum(b.sums.n_timed for b in base if b.mode == "holdout")
        base_ms = sum(b.sums.sum_ms_per_token for b in base if b.mode == "holdout")
        speedup, source = None, "—"
        if base_n >= MIN_REQUESTS and s.sums.ms_per_token_mean:
            speedup, source = (base_ms / base_n) / s.sums.ms_per_token_mean, "measured"
        else:
            inputs = data.speedup_inputs(f.url, s.workload, f.range.start, f.range.end, s.pair)
            if inputs is not None:
                speedup, source = inputs.speedup(), "estimated"
        rows.append(
            {
                "Workload": s.workload,
                "Pair": s.pair.label,
                "Drafter": s.pair.drafter,
                "Requests": s.sums.n_requests,
                "Acceptance": s.sums.acceptance_rate_tokens,
                "Mean accept. length": s.sums.mean_acceptance_length,
                "Speedup": speedup,
                "Speedup is": source,
                **_verdict_cells(verdicts.get((s.workload, s.pair.label))),
                "ms/token": s.sums.ms_per_token_mean,
                "p95 ms/token": s.ms_per_token_p95,
                "tokens/s": s.sums.tokens_per_second,
            }
        )
    return rows


def _verdict_cells(v: Verdict | None) -> dict[str, Any]:
    """The drift run's verdict of the pair, its interval, and why; a dash with the reason where there is none."""
    if v is None:
        return {"Pays?": "not measured", "Interval": "—", "Why": NOT_TESTED}
    interval = f"[{v.ci[0]:.2f}, {v.ci[1]:.2f}]" if v.ci else "—"
    return {"Pays?": VERDICT_LABELS[v.verdict], "Interval": interval, "Why": v.reason}


EVALUATION_COLUMNS = {
    "Predicted": st.column_config.NumberColumn(format="%.2f×", help="the candidate's controller, from the learn half"),
    "Measured": st.column_config.NumberColumn(format="%.2f×", help="decode time per token against plain, held out"),
    "Acceptance": st.column_config.NumberColumn(format="percent"),
}


def evaluation_rows(f: Filters, found: list[StoredEvaluation]) -> list[dict[str, Any]]:
    """One row per stored verdict's candidate: the newest `draftwatch evaluate --store` run per target and workload.

    A workload with live records follows the sidebar's filter; one without (validated before it
    serves) always shows.
    """
    rows = []
    for e in found:
        if e.workload in f.available and not f.shows(e.workload):
            continue
        for c in e.candidates:
            drafter = str(c.get("drafter", ""))
            rows.append(
                {
                    "Workload": e.workload,
                    "Target": e.target_model,
                    "Candidate": drafter,
                    "Predicted": c.get("predicted_speedup"),
                    "Measured": c.get("measured_speedup"),
                    "γ": c.get("gamma"),
                    "Acceptance": c.get("acceptance"),
                    "Recommended": "yes" if drafter == e.recommendation else "",
                    "Evaluated": e.ran_at.strftime("%Y-%m-%d %H:%M UTC"),
                    "Sample": e.sample,
                }
            )
    return rows


def evaluations(f: Filters) -> None:
    found = data.evaluations(f.url)
    if not found:
        st.caption(
            "No stored evaluations: `draftwatch evaluate ... --store` validates candidate drafters on a prompt "
            "sample and puts its verdict here, beside the live figures."
        )
        return
    st.subheader("Latest evaluations")
    rows = evaluation_rows(f, found)
    if rows:
        st.dataframe(
            rows,
            hide_index=True,
            column_config=EVALUATION_COLUMNS,
            key="evaluations_table",
            placeholder=components.MISSING,
        )
    plain = sorted(e.workload for e in found if e.recommendation == "plain")
    if plain:
        st.caption(f"Recommended plain decoding (no candidate predicted a gain): {', '.join(plain)}.")


def body(f: Filters) -> None:
    if components.empty_state(f):
        evaluations(f)
        return
    rows = rows_of(f, data.pair_summaries(f.url, f.range.start, f.range.end))
    if not rows:
        st.info("No speculative requests in this range for the selected workloads: nothing to compare.")
        evaluations(f)
        return
    st.dataframe(rows, hide_index=True, column_config=COLUMNS, key="pairs_table", placeholder=components.MISSING)
    chart_rows = [
        {
            "workload": r["Workload"],
            "pair": r["Pair"],
            "acceptance": r["Acceptance"],
            "speedup": r["Speedup"],
            "p95": r["p95 ms/token"],
        }
        for r in rows
    ]
    left, middle, right = st.columns(3)
    left.altair_chart(charts.grouped_bars(chart_rows, "acceptance", "acceptance rate", "%"), width="stretch")
    middle.altair_chart(charts.grouped_bars(chart_rows, "speedup", "speedup ×", ".2f"), width="stretch")
    right.altair_chart(charts.grouped_bars(chart_rows, "p95", "p95 ms per token", ".2f"), width="stretch")
    st.caption(
        f"{f.range.label()}. Speedup is measured against the workload's holdout (plain) traffic on the same target "
        f"once it has {MIN_REQUESTS} requests, else estimated from the pair's own acceptance and costs."
    )
    evaluations(f)


components.live(body)
