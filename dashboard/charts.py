"""Altair charts of the dashboard, built from plain rows (lists of dicts).

Colours: series take the Streamlit theme's palette (``theme="streamlit"`` when drawn), which has
light and dark variants; the few fixed colours (drift red, version purple, regression orange) are
mid-tone so that they read on both backgrounds. Axes and labels come from the theme too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import altair as alt

DRIFT_COLOR: Final = "#e45756"
VERSION_COLOR: Final = "#b279a2"
ROUTE_COLOR: Final = "#f58518"
REGRESSION_COLOR: Final = "#f58518"
REFERENCE_COLOR: Final = "#8c8c8c"
CURRENT_COLOR: Final = "#4c78a8"
WINDOWS: Final = ("reference", "current")  # the order comparison charts show the two windows in

Rows = Sequence[dict[str, Any]]
# Altair's builder methods return loosely typed unions (Chart | FacetChart ...): charts are passed on as-is.
ChartSpec = Any


def _data(rows: Rows) -> Any:
    # alt.Data carries no type annotations; inline values keep the chart self-contained (no pandas).
    return alt.Data(values=list(rows))  # type: ignore[no-untyped-call]


def _markers(events: Rows, color: str, label: str) -> ChartSpec:
    """Vertical rules at ``ts`` with a tooltip ``text``."""
    return (
        alt.Chart(_data(events))
        .mark_rule(color=color, strokeDash=[4, 3], strokeWidth=1.5)
        .encode(
            x="ts:T",
            tooltip=[alt.Tooltip("ts:T", title="when", format="%Y-%m-%d %H:%M"), alt.Tooltip("text:N", title=label)],
        )
    )


def acceptance_over_time(points: Rows, drifts: Rows, versions: Rows, routes: Rows = ()) -> ChartSpec:
    """Acceptance per time step; drift findings (red), model-version changes (purple) and routing switches (orange)."""
    base = alt.Chart(_data(points)).encode(
        x=alt.X("bucket:T", title=None),
        y=alt.Y("acceptance:Q", title="acceptance rate", axis=alt.Axis(format="%"), scale=alt.Scale(zero=False)),
        tooltip=[
            alt.Tooltip("bucket:T", title="from", format="%Y-%m-%d %H:%M"),
            alt.Tooltip("acceptance:Q", format=".1%"),
            alt.Tooltip("requests:Q"),
        ],
    )
    layers: list[Any] = [base.mark_line(point=len(points) < 40)]
    if drifts:
        layers.append(_markers(drifts, DRIFT_COLOR, "drift finding"))
    if versions:
        layers.append(_markers(versions, VERSION_COLOR, "model version"))
    if routes:
        layers.append(_markers(routes, ROUTE_COLOR, "routing"))
    return alt.layer(*layers).properties(height=260)


def per_position(rows: Rows) -> ChartSpec:
    """Acceptance at draft position i (1-based on the axis), per verification step."""
    return (
        alt.Chart(_data(rows))
        .mark_line(point=True)
        .encode(
            x=alt.X("position:O", title="draft position"),
            y=alt.Y("rate:Q", title="accepted per step", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])),
            tooltip=[alt.Tooltip("position:O"), alt.Tooltip("rate:Q", format=".1%"), alt.Tooltip("accepted:Q")],
        )
        .properties(height=240)
    )


def length_histogram(rows: Rows) -> ChartSpec:
    """Share of verification steps that accepted exactly j drafts, reference against current window."""
    return (
        alt.Chart(_data(rows))
        .mark_bar()
        .encode(
            x=alt.X("accepted:O", title="drafts accepted in a step"),
            xOffset=alt.XOffset("window:N", sort=list(WINDOWS)),
            y=alt.Y("share:Q", title="share of steps", axis=alt.Axis(format="%")),
            color=_window_color(),
            tooltip=[alt.Tooltip("window:N"), alt.Tooltip("accepted:O"), alt.Tooltip("share:Q", format=".1%")],
        )
        .properties(height=240)
    )


def _window_color() -> alt.Color:
    """Reference and current side by side, in the two colours every comparison chart uses."""
    return alt.Color(
        "window:N",
        sort=list(WINDOWS),
        scale=alt.Scale(domain=list(WINDOWS), range=[REFERENCE_COLOR, CURRENT_COLOR]),
        legend=alt.Legend(orient="top", title=None),
    )


def bucket_acceptance(rows: Rows, buckets: Sequence[str], title: str) -> ChartSpec:
    """Token acceptance per length bucket, reference against current (rows: window, bucket, acceptance, drafted,
    requests)."""
    return (
        alt.Chart(_data(rows))
        .mark_bar()
        .encode(
            x=alt.X("bucket:N", title=title, sort=list(buckets)),
            xOffset=alt.XOffset("window:N", sort=list(WINDOWS)),
            y=alt.Y("acceptance:Q", title="acceptance (tokens)", axis=alt.Axis(format="%")),
            color=_window_color(),
            tooltip=[
                alt.Tooltip("window:N"),
                alt.Tooltip("bucket:N"),
                alt.Tooltip("acceptance:Q", format=".1%"),
                alt.Tooltip("drafted:Q", format=",", title="drafted tokens"),
                alt.Tooltip("requests:Q", format=",", title="requests that drafted"),
            ],
        )
        .properties(height=240)
    )


def percentiles_over_time(rows: Rows, regressions: Rows, unit: str) -> ChartSpec:
    """Lines per percentile (long rows: bucket, percentile, value); latency regressions shaded orange."""
    layers: list[Any] = []
    if regressions:
        layers.append(
            alt.Chart(_data(regressions))
            .mark_rect(color=REGRESSION_COLOR, opacity=0.18)
            .encode(
                x="start:T",
                x2="end:T",
                tooltip=[alt.Tooltip("text:N", title="regression"), alt.Tooltip("start:T"), alt.Tooltip("end:T")],
            )
        )
    layers.append(
        alt.Chart(_data(rows))
        .mark_line()
        .encode(
            x=alt.X("bucket:T", title=None),
            y=alt.Y("value:Q", title=unit),
            color=alt.Color("percentile:N", sort=["p50", "p95", "p99"], legend=alt.Legend(orient="top", title=None)),
            tooltip=[
                alt.Tooltip("bucket:T", format="%Y-%m-%d %H:%M"),
                alt.Tooltip("percentile:N"),
                alt.Tooltip("value:Q", format=".2f"),
            ],
        )
    )
    return alt.layer(*layers).properties(height=240)


def what_if_gamma(rows: Rows, current_gamma: int | None) -> ChartSpec:
    """Expected speedup against γ; the break-even line at 1 and the current γ marked."""
    line = (
        alt.Chart(_data(rows))
        .mark_line(point=True)
        .encode(
            x=alt.X("gamma:O", title="γ (drafts per step)"),
            y=alt.Y("speedup:Q", title="expected speedup ×", scale=alt.Scale(zero=False)),
            tooltip=[alt.Tooltip("gamma:O", title="γ"), alt.Tooltip("speedup:Q", format=".2f")],
        )
    )
    even = alt.Chart(_data([{"y": 1.0}])).mark_rule(color=DRIFT_COLOR, strokeDash=[4, 3]).encode(y="y:Q")
    layers: list[Any] = [even, line]
    marked = [r for r in rows if r["gamma"] == current_gamma]
    if marked:
        layers.append(
            alt.Chart(_data(marked))
            .mark_point(size=180, shape="diamond", filled=True, color=REGRESSION_COLOR)
            .encode(x="gamma:O", y="speedup:Q", tooltip=[alt.Tooltip("speedup:Q", title="current γ", format=".2f")])
        )
    return alt.layer(*layers).properties(height=240)


def grouped_bars(rows: Rows, field: str, title: str, fmt: str) -> ChartSpec:
    """One bar per pair within each workload (Pairs page)."""
    return (
        alt.Chart(_data(rows))
        .mark_bar()
        .encode(
            x=alt.X("workload:N", title=None),
            xOffset="pair:N",
            y=alt.Y(f"{field}:Q", title=title, axis=alt.Axis(format=fmt) if fmt else alt.Axis()),
            color=alt.Color("pair:N", legend=alt.Legend(orient="bottom", title=None, columns=1, labelLimit=400)),
            tooltip=[alt.Tooltip("workload:N"), alt.Tooltip("pair:N"), alt.Tooltip(f"{field}:Q", format=fmt or ".2f")],
        )
        .properties(height=260)
    )


def effect_history(rows: Rows) -> ChartSpec:
    """A test's effect per run with its interval; red points where the run decided drift."""
    base = alt.Chart(_data(rows)).encode(x=alt.X("created_at:T", title="run"))
    band = base.mark_rule(opacity=0.5).encode(y=alt.Y("ci_low:Q", title="effect"), y2="ci_high:Q")
    points = base.mark_point(filled=True, size=60).encode(
        y="effect:Q",
        color=alt.Color(
            "decision:N",
            scale=alt.Scale(
                domain=["drift", "no_drift", "insufficient_data"], range=[DRIFT_COLOR, CURRENT_COLOR, REFERENCE_COLOR]
            ),
            legend=alt.Legend(orient="top", title=None),
        ),
        tooltip=[
            alt.Tooltip("created_at:T", format="%Y-%m-%d %H:%M"),
            alt.Tooltip("metric:N"),
            alt.Tooltip("effect:Q", format=".3f"),
            alt.Tooltip("q:Q", format=".3g"),
            alt.Tooltip("decision:N"),
        ],
    )
    return alt.layer(band, points).properties(height=240)


ROLLOUT_EVENTS: Final = ("started", "advanced", "held", "kept", "promoted", "rolled_back", "aborted", "now")
# Per event kind: blue for the steps, orange for a hold or a workload kept, red for a rollback, green for a promotion.
PASS_COLOR: Final = "#54a24b"
ROLLOUT_COLORS: Final = (
    CURRENT_COLOR, CURRENT_COLOR, REGRESSION_COLOR, REGRESSION_COLOR, PASS_COLOR, DRIFT_COLOR, REFERENCE_COLOR,
    REFERENCE_COLOR,
)  # fmt: skip


def rollout_timeline(rows: Rows) -> ChartSpec:
    """A rollout's steps: the candidate's share over time (a staircase) with a point per event (rows: ts, share,
    event, step, text); a last row of event ``now`` extends a rollout that still runs or serves."""
    base = alt.Chart(_data(rows)).encode(
        x=alt.X("ts:T", title=None),
        y=alt.Y("share:Q", title="candidate's share", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])),
    )
    line = base.mark_line(interpolate="step-after", color=CURRENT_COLOR)
    points = base.mark_point(filled=True, size=90).encode(
        color=alt.Color(
            "event:N",
            scale=alt.Scale(domain=list(ROLLOUT_EVENTS), range=list(ROLLOUT_COLORS)),
            legend=alt.Legend(orient="top", title=None),
        ),
        tooltip=[
            alt.Tooltip("ts:T", title="when", format="%Y-%m-%d %H:%M"),
            alt.Tooltip("event:N"),
            alt.Tooltip("step:Q"),
            alt.Tooltip("share:Q", format=".0%"),
            alt.Tooltip("text:N", title="reason"),
        ],
    )
    return alt.layer(line, points).properties(height=240)


def rollout_speed(rows: Rows) -> ChartSpec:
    """The candidate's decode speed over the current drafter's per workload, with its interval; 1 is a tie
    (rows: workload, ratio, ci_low, ci_high, outcome)."""
    base = alt.Chart(_data(rows)).encode(x=alt.X("workload:N", title=None, axis=alt.Axis(labelAngle=0)))
    band = base.mark_rule(strokeWidth=2, opacity=0.6).encode(
        y=alt.Y("ci_low:Q", title="decode speed × the current drafter", scale=alt.Scale(zero=False)), y2="ci_high:Q"
    )
    points = base.mark_point(filled=True, size=90).encode(
        y="ratio:Q",
        color=alt.Color(
            "outcome:N",
            scale=alt.Scale(domain=["pass", "marginal", "fail"], range=[PASS_COLOR, REGRESSION_COLOR, DRIFT_COLOR]),
            legend=alt.Legend(orient="top", title=None),
        ),
        tooltip=[
            alt.Tooltip("workload:N"),
            alt.Tooltip("ratio:Q", format=".2f", title="×"),
            alt.Tooltip("ci_low:Q", format=".2f"),
            alt.Tooltip("ci_high:Q", format=".2f"),
            alt.Tooltip("outcome:N"),
        ],
    )
    even = alt.Chart(_data([{"y": 1.0}])).mark_rule(color=REFERENCE_COLOR, strokeDash=[4, 3]).encode(y="y:Q")
    return alt.layer(even, band, points).properties(height=240)


def waterfall_rows(split: dict[str, Any]) -> list[dict[str, Any]]:
    """The split's parts as waterfall steps from the reference window's figure to the current one's.

    Each step runs from the total before it to the total after it, its interval around its own end;
    a Level 2 part is labelled with its workload (``content · extract``).

    >>> split = {"detail": {"rate_ref": 0.5}, "parts": [
    ...     {"cause": "mix", "workload": None, "value": -0.1, "low": -0.15, "high": -0.05, "detail": {"named": True}},
    ...     {"cause": "content", "workload": "x", "value": 0.02, "low": None, "high": None,
    ...      "detail": {"named": False}}]}
    >>> [(r["part"], r["start"], round(r["end"], 2), r["low"], r["named"]) for r in waterfall_rows(split)]
    [('mix', 0.5, 0.4, 0.35, True), ('content · x', 0.4, 0.42, None, False)]
    """
    total = split["detail"].get("rate_ref")
    if total is None:
        return []
    rows = []
    for order, p in enumerate(q for q in split["parts"] if q["value"] is not None):
        end = total + p["value"]
        known = p["low"] is not None and p["high"] is not None
        rows.append({
            "order": order,
            "part": p["cause"] if p["workload"] is None else f"{p['cause']} · {p['workload']}",
            "start": total,
            "end": end,
            "value": p["value"],
            "low": total + p["low"] if known else None,
            "high": total + p["high"] if known else None,
            "named": bool(p["detail"].get("named")),
        })  # fmt: skip
        total = end
    return rows


def split_waterfall(rows: Rows, title: str = "acceptance") -> ChartSpec:
    """:func:`waterfall_rows` as bars (red: named, grey: within noise) with each part's interval as a rule."""
    base = alt.Chart(_data(rows)).encode(x=alt.X("part:N", sort=alt.SortField("order"), title=None))
    bars = base.mark_bar().encode(
        y=alt.Y("start:Q", title=title, scale=alt.Scale(zero=False)),
        y2="end:Q",
        color=alt.Color(
            "named:N",
            scale=alt.Scale(domain=[True, False], range=[DRIFT_COLOR, REFERENCE_COLOR]),
            legend=alt.Legend(orient="top", title="named"),
        ),
        tooltip=[alt.Tooltip("part:N"), alt.Tooltip("value:Q", format="+.3f"), alt.Tooltip("named:N")],
    )
    rules = base.mark_rule(strokeWidth=2).encode(y="low:Q", y2="high:Q")
    return alt.layer(bars, rules).properties(height=260)


def split_over_time_rows(history: Sequence[tuple[Any, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per run, its named parts (the rest as one ``not named`` part), for :func:`split_over_time`.

    >>> split = {"change": -0.1, "parts": [
    ...     {"cause": "content", "workload": "x", "value": -0.08, "detail": {"named": True}},
    ...     {"cause": "mix", "workload": None, "value": -0.02, "detail": {"named": False}}]}
    >>> [(r["part"], round(r["value"], 3)) for r in split_over_time_rows([("t", split)])]
    [('content · x', -0.08), ('not named', -0.02)]
    """
    rows = []
    for started, split in history:
        if split.get("change") is None:
            continue
        named = [p for p in split["parts"] if p["detail"].get("named") and p["value"] is not None]
        for p in named:
            label = p["cause"] if p["workload"] is None else f"{p['cause']} · {p['workload']}"
            rows.append({"run": str(started), "part": label, "value": p["value"], "change": split["change"]})
        rest = split["change"] - sum(p["value"] for p in named)
        rows.append({"run": str(started), "part": "not named", "value": rest, "change": split["change"]})
    return rows


def split_over_time(rows: Rows) -> ChartSpec:
    """Each run's change of acceptance as stacked bars of its named parts, the change itself a point."""
    base = alt.Chart(_data(rows)).encode(x=alt.X("run:T", title="run"))
    bars = base.mark_bar().encode(
        y=alt.Y("value:Q", title="change of acceptance", stack="zero"),
        color=alt.Color("part:N", legend=alt.Legend(orient="top", title=None)),
        tooltip=[alt.Tooltip("run:T", format="%Y-%m-%d %H:%M"), alt.Tooltip("part:N"),
                 alt.Tooltip("value:Q", format="+.3f")],
    )  # fmt: skip
    points = base.mark_point(filled=True, color=REFERENCE_COLOR).encode(y="change:Q")
    return alt.layer(bars, points).properties(height=220)
