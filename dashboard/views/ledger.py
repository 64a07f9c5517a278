"""Ledger: what speculation saved or cost per workload and load level, the curves and where they cross."""

from __future__ import annotations

from typing import Any

import altair as alt
import streamlit as st

from dashboard import components, data
from dashboard.components import Filters
from monitor.drift.detectors.ledger import Ledger, WorkloadLedger

st.title("Ledger")
st.caption(
    "Per workload and load level (requests in flight at the replica), the decode speed of plain decoding over "
    "speculation's (above 1: speculation is faster) with its 95 % interval, and the replica-seconds the window's "
    "speculative tokens saved (negative: lost) against serving them plain at the same load. A level whose interval "
    "spans 1 is inconclusive; one with too few requests a side gets no figure. Per-request speed at equal "
    "concurrency, not throughput per GPU at a latency target: see docs/statistics.md."
)

COLUMNS = {
    "Ratio": st.column_config.NumberColumn(format="%.2f×"),
    "Low": st.column_config.NumberColumn(format="%.2f"),
    "High": st.column_config.NumberColumn(format="%.2f"),
    "Tokens": st.column_config.NumberColumn(format="localized"),
    "GPU-s saved": st.column_config.NumberColumn(format="%.1f", help="replica-seconds; negative: speculation cost"),
    "USD saved": st.column_config.NumberColumn(format="%.4f"),
}


def grid(found: Ledger) -> list[dict[str, Any]]:
    return [
        {
            "Workload": w.workload,
            "Pair": w.pair.label,
            "In flight": f"{b.level.inflight_low}-{b.level.inflight_high}",
            "Ratio": b.level.ratio,
            "Low": b.level.low,
            "High": b.level.high,
            "n spec": b.level.n_spec,
            "n plain": b.level.n_plain,
            "Tokens": b.tokens,
            "GPU-s saved": b.seconds,
            "USD saved": b.usd,
            "Call": b.level.call if b.level.measured else b.level.note,
        }
        for w in found.workloads
        for b in w.bills
    ]


def curves(found: list[WorkloadLedger]) -> Any:
    """The ratio per level (the interval as a rule), 1 as a dashed line, each crossover as a red rule."""
    rows = [
        {"workload": w.workload, "inflight": b.level.inflight_low, "ratio": b.level.ratio, "low": b.level.low,
         "high": b.level.high}
        for w in found
        for b in w.bills
        if b.level.measured
    ]  # fmt: skip
    crossings = [{"workload": w.workload, "inflight": w.curve.crossover.inflight} for w in found if w.curve.crossover]
    x = alt.X("inflight:Q", title="requests in flight (level's lowest)", scale=alt.Scale(type="log", base=2))
    base = alt.Chart(alt.Data(values=rows)).encode(x=x, color=alt.Color("workload:N"))  # type: ignore[no-untyped-call]
    band = base.mark_rule(opacity=0.5).encode(y=alt.Y("low:Q", title="plain / speculative"), y2="high:Q")
    line = base.mark_line(point=True).encode(y="ratio:Q", tooltip=["workload:N", "inflight:Q", "ratio:Q"])
    one = alt.Chart(alt.Data(values=[{"y": 1.0}])).mark_rule(strokeDash=[4, 3]).encode(y="y:Q")  # type: ignore[no-untyped-call]
    cross = (
        alt.Chart(alt.Data(values=crossings))  # type: ignore[no-untyped-call]
        .mark_rule(color="#e45756", strokeWidth=2)
        .encode(x="inflight:Q", tooltip=["workload:N", alt.Tooltip("inflight:Q", title="crossover")])
    )
    return alt.layer(band, line, one, cross).properties(height=280)


def body(f: Filters) -> None:
    if components.empty_state(f):
        return
    left, right = st.columns(2)
    spec = left.number_input("Speculative replica, USD per hour", min_value=0.0, value=0.0, key="dw_price_spec")
    plain = right.number_input("Baseline replica, USD per hour", min_value=0.0, value=0.0, key="dw_price_base")
    prices = (("speculative", spec), ("baseline", plain)) if spec > 0 and plain > 0 else ()
    found = data.ledger(f.url, f.range.start, f.range.end, prices)
    shown = [w for w in found.workloads if f.shows(w.workload)]
    if not shown:
        st.info(f"Nothing to bill: no speculative request between {f.range.label()}.", icon=":material/inbox:")
        return
    chosen = Ledger(found.start, found.end, shown, found.prices, found.ci_level)
    total = chosen.total
    a, b, c = st.columns(3)
    a.metric("GPU-seconds saved", components.num(total.seconds, 1))
    b.metric("USD saved", components.num(total.usd, 4) if prices else "set both prices")
    c.metric("Speculative tokens", f"{total.tokens:,}", help=f"{total.tokens_unvalued:,} without a measured ratio")
    st.dataframe(
        grid(chosen), hide_index=True, column_config=COLUMNS, key="ledger_table", placeholder=components.MISSING
    )
    if any(b.level.measured for w in shown for b in w.bills):
        st.altair_chart(curves(shown), width="stretch")
    for w in shown:
        st.caption(f"**{w.workload}** ({w.pair.label}): {w.note}")


components.live(body)
