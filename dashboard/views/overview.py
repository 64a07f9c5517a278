"""Overview: one row per workload, its status, and the firing alerts on top."""

from __future__ import annotations

import streamlit as st

from dashboard import alerts_view, components, data, status
from dashboard.components import MISSING, Filters

st.title("Overview")
st.caption("Where speculation helps and where it hurts, per workload, over the range chosen in the sidebar.")

COLUMNS = {
    "Requests": st.column_config.NumberColumn(format="localized"),
    "Acceptance": st.column_config.NumberColumn(
        format="percent",
        help=f"accepted / drafted tokens; {MISSING} where the requests report no draft counts (an engine behind the "
        "proxy that returns none: its own counters can be scraped, docs/scrape.md)",
    ),
    "Δ acceptance (pts)": st.column_config.NumberColumn(
        format="%+.1f",
        help="change in percentage points against the previous window of the same length; "
        f"{MISSING} without an acceptance in both windows",
    ),
    "Mean accept. length": st.column_config.NumberColumn(
        format="%.2f", help=f"tokens per verification step; {MISSING} where no verification steps were reported"
    ),
    "Speedup": st.column_config.NumberColumn(
        format="%.2f×",
        help="measured: holdout over speculative ms per token; estimated: Leviathan et al. at the current γ; "
        f"{MISSING} without holdout, a drift run's figure or draft timings to estimate from ('Why' says how)",
    ),
    "p95 ms/token": st.column_config.NumberColumn(format="%.2f", help=f"{MISSING} without timed requests"),
    "Δ p95": st.column_config.NumberColumn(
        format="percent", help=f"relative change against the previous window; {MISSING} where it has no requests"
    ),
    "γ": st.column_config.TextColumn(
        help="drafts per step of the newest request; empty where the requests do not say (a proxied engine)"
    ),
    "Pays?": st.column_config.TextColumn(
        help="is speculation paying here: the newest drift run's verdict on decode speed against plain decoding, "
        "like for like (context length and load); 'not measured' needs a plain baseline (docs/verdict.md)"
    ),
}


SCRAPED_COLUMNS = {
    "Intervals": st.column_config.NumberColumn(help="intervals between two scrapes: the unit of evidence here"),
    "Acceptance": st.column_config.NumberColumn(format="percent", help="accepted / drafted tokens (SGLang: its gauge)"),
    "Mean accept. length": st.column_config.NumberColumn(format="%.2f"),
    "Drafted": st.column_config.NumberColumn(format="localized"),
}


def body(f: Filters) -> None:
    alerts_view.firing_banner(f.url)
    if not components.empty_state(f):
        requests(f)
    scraped(f)


def requests(f: Filters) -> None:
    window = f.range
    # Every workload over the range: the breakdowns by length are on the Workload page, not here.
    shown = [s for s in data.summaries(f.url, window.start, window.end, lengths_too=False) if f.shows(s.workload)]
    reference = data.summaries(f.url, window.reference.start, window.reference.end, lengths_too=False)
    settings = data.current_settings(f.url, window.start, window.end)
    # The estimate needs a per-request read: only where the measured speedup is missing.
    estimates = {
        s.workload: data.speedup_inputs(f.url, s.workload, window.start, window.end)
        for s in shown
        if s.holdout_requests < status.MIN_REQUESTS
    }
    rows = status.overview_rows(shown, reference, settings, estimates, data.latest_drift_results(f.url))
    columns = st.columns(len(status.STATUSES))
    for column, name in zip(columns, status.STATUSES, strict=True):
        column.metric(status.BADGES[name], sum(r.status == name for r in rows))
    table = status.table(rows)
    st.dataframe(table, hide_index=True, column_config=COLUMNS, key="overview_table", placeholder=MISSING)
    run = data.latest_drift_run(f.url)
    st.caption(
        f"{window.label()}; changes are against {window.reference.label()}. "
        + (
            f"Statuses use drift run {run.run_id[:8]} of {run.started_at:%Y-%m-%d %H:%M} UTC."
            if run
            else "No drift run yet: statuses use the figures only (`draftwatch drift run`)."
        )
    )


def scraped(f: Filters) -> None:
    """Scrape mode's engines: aggregate figures per target and series, marked apart from the request records."""
    targets = data.scrape_targets(f.url)
    if not targets:
        return
    st.subheader("Scraped engines (aggregate)")
    # The workload filter lists the request records' workloads: it narrows scraped series only when used.
    narrowed = f.workloads != f.available
    series = [s for s in data.scraped(f.url, f.range.start, f.range.end) if not narrowed or f.shows(s.workload)]
    rows = [
        {
            "Source": s.source,
            "Workload": s.workload,
            "Target": s.target_model,
            "Drafter": s.drafter,
            "Intervals": s.intervals,
            "Acceptance": s.acceptance_rate if s.acceptance_rate is not None else s.accept_rate_gauge,
            "Mean accept. length": s.mean_acceptance_length,
            "Drafted": s.draft_tokens,
        }
        for s in series
    ]
    st.dataframe(rows, hide_index=True, column_config=SCRAPED_COLUMNS, key="scraped_table", placeholder=MISSING)
    down = [t for t in targets if t.status != "up"]
    restarted = [f"{t.name} restarted {t.resets}×, last {t.reset_at:%Y-%m-%d %H:%M} UTC" for t in targets if t.reset_at]
    st.caption(
        f"From the engines' own counters ({len(targets)} target(s)), per interval between scrapes, not per request. "
        + ("; ".join(f"{t.name}: {t.status} ({t.error})" for t in down) if down else "Every target is up.")
        + (" " + "; ".join(restarted) + "." if restarted else "")
    )


components.live(body)
