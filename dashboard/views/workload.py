"""Workload: acceptance over time with drift findings and version changes, per-position acceptance,
acceptance-length histogram, acceptance by prompt length and by output position (each reference
against current), latency percentiles with regressions shaded, and the what-if γ chart."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, components, data
from dashboard.components import Filters
from dashboard.status import MIN_REQUESTS
from monitor.store.lengths import PROMPT_LABELS, SPAN_LABELS
from monitor.store.reads.results import LengthAcceptance

st.title("Workload")
WORKLOAD_KEY = "dw_workload"


def _pick(f: Filters) -> str | None:
    options = [w for w in f.workloads if w in f.available]
    if not options:
        return None
    # A link may name the workload (?workload=code); otherwise the previous choice, else the first.
    wanted = st.query_params.get("workload") or st.session_state.get(WORKLOAD_KEY)
    index = options.index(wanted) if wanted in options else 0
    choice = st.selectbox("Workload", options, index=index)
    st.session_state[WORKLOAD_KEY] = choice
    return str(choice)


def _kpis(f: Filters, workload: str) -> None:
    window = f.range
    now = data.summaries(f.url, window.start, window.end, workload)
    before = data.summaries(f.url, window.reference.start, window.reference.end, workload)
    s, r = now[0], before[0] if before else None
    a, b, c, d = st.columns(4)
    a.metric("Requests", f"{s.requests:,}", None if r is None else f"{s.requests - r.requests:+,}")
    change = None
    if r and s.acceptance_rate_tokens is not None and r.acceptance_rate_tokens is not None:
        change = f"{(s.acceptance_rate_tokens - r.acceptance_rate_tokens) * 100:+.1f} pts"
    b.metric("Acceptance", components.pct(s.acceptance_rate_tokens), change)
    c.metric("Mean acceptance length", components.num(s.mean_acceptance_length))
    p95 = None
    if r and s.ms_per_token_p95 and r.ms_per_token_p95:
        p95 = f"{(s.ms_per_token_p95 / r.ms_per_token_p95 - 1) * 100:+.1f} %"
    # Lower latency is better: Streamlit's inverse colouring shows a rise in red.
    d.metric("p95 ms / token", components.num(s.ms_per_token_p95), p95, delta_color="inverse")
    if s.requests < MIN_REQUESTS:
        st.warning(f"Only {s.requests} requests in this range: figures are noisy and drift tests need {MIN_REQUESTS}.")


def _acceptance(f: Filters, workload: str) -> None:
    window = f.range
    points = [
        {"bucket": p.bucket.isoformat(), "acceptance": p.acceptance_rate_tokens, "requests": p.requests}
        for p in data.time_series(f.url, workload, window.start, window.end, window.step)
        if p.acceptance_rate_tokens is not None
    ]
    drifts = [
        {"ts": r.created_at.isoformat(), "text": f"{r.result.test}: {r.result.metric} ({r.result.effect or 0:+.3g})"}
        for r in data.drift_history(f.url, window.start, window.end, workload, "drift")
        if r.result.test != "latency"
    ]
    versions = [
        {"ts": e.ts.isoformat(), "text": f"{e.role} {e.model} {e.version} ({e.kind})"}
        for e in data.deployment_events(f.url, window.start, window.end)
        if e.workload in (None, workload)
    ]
    routes = [
        {
            "ts": e.ts.isoformat(),
            "text": ("to the plain baseline: " if e.routed else "back to speculation: ") + e.reason,
        }
        for e in data.routing_switches(f.url, window.start, window.end, workload)
    ]
    st.subheader("Acceptance over time")
    if points:
        st.altair_chart(charts.acceptance_over_time(points, drifts, versions, routes), width="stretch")
        st.caption(
            "Red rules: drift findings; purple: model version changes; orange: routing switches (proxy.on_net_loss). "
            "Hover for details."
        )
    else:
        st.info("No speculative requests in this range: speculation is off for this workload (plain mode).")


def _acceptance_shape(f: Filters, workload: str) -> None:
    window = f.range
    left, right = st.columns(2)
    with left:
        st.subheader("Acceptance by draft position")
        positions = data.position_acceptance(f.url, workload, window.start, window.end)
        rows = [{"position": p.position + 1, "rate": p.rate, "accepted": p.accepted} for p in positions]
        if rows:
            st.altair_chart(charts.per_position(rows), width="stretch")
        else:
            st.info("No verification steps in this range.")
    with right:
        st.subheader("Acceptance length")
        shares = [
            {"window": name, "accepted": b.accepted, "share": b.share}
            for name, (start, end) in (
                ("reference", (window.reference.start, window.reference.end)),
                ("current", (window.start, window.end)),
            )
            for b in data.length_histogram(f.url, workload, start, end)
        ]
        if shares:
            st.altair_chart(charts.length_histogram(shares), width="stretch")
            st.caption("Reference: the previous window of the same length.")
        else:
            st.info("No verification steps in this range.")


def _bucket_rows(name: str, buckets: list[LengthAcceptance]) -> list[dict[str, object]]:
    return [
        {"window": name, "bucket": b.bucket, "acceptance": b.acceptance_rate, "drafted": b.drafted,
         "requests": b.drafting_requests}
        for b in buckets
        if b.acceptance_rate is not None
    ]  # fmt: skip


def _by_length(f: Filters, workload: str) -> None:
    window = f.range
    found = {
        name: data.summaries(f.url, start, end, workload)
        for name, (start, end) in (
            ("reference", (window.reference.start, window.reference.end)),
            ("current", (window.start, window.end)),
        )
    }
    prompt = [row for name, s in found.items() if s for row in _bucket_rows(name, s[0].by_prompt_length)]
    output = [row for name, s in found.items() if s for row in _bucket_rows(name, s[0].by_output_position)]
    left, right = st.columns(2)
    with left:
        st.subheader("Acceptance by prompt length")
        if prompt:
            st.altair_chart(charts.bucket_acceptance(prompt, PROMPT_LABELS, "prompt tokens"), width="stretch")
        else:
            st.info("No drafted tokens in this range.")
    with right:
        st.subheader("Acceptance by output position")
        if output:
            chart = charts.bucket_acceptance(output, SPAN_LABELS, "output position of the step")
            st.altair_chart(chart, width="stretch")
            st.caption("Steps counted by the output token they start at. Serving stacks do not report positions.")
        else:
            st.info(
                "No request in this range reports output positions: serving stacks do not, the embedded decoder does."
            )


def _latency(f: Filters, workload: str) -> None:
    window = f.range
    points = data.latency_series(f.url, workload, window.start, window.end, window.step)
    regressions = [
        {
            "start": (r.result.cur_start or r.created_at).isoformat(),
            "end": (r.result.cur_end or r.created_at).isoformat(),
            "text": f"{r.result.metric}: ×{r.result.effect or 0:.2f}",
        }
        for r in data.drift_history(f.url, window.start, window.end, workload, "drift", "latency")
    ]
    per_token = [
        {"bucket": p.bucket.isoformat(), "percentile": name, "value": value}
        for p in points
        for name, value in (("p50", p.ms_per_token_p50), ("p95", p.ms_per_token_p95), ("p99", p.ms_per_token_p99))
        if value is not None
    ]
    ttft = [
        {"bucket": p.bucket.isoformat(), "percentile": name, "value": value}
        for p in points
        for name, value in (("p50", p.ttft_p50_ms), ("p95", p.ttft_p95_ms))
        if value is not None
    ]
    left, right = st.columns(2)
    with left:
        st.subheader("Latency per output token")
        if per_token:
            st.altair_chart(charts.percentiles_over_time(per_token, regressions, "ms per token"), width="stretch")
        else:
            st.info("No timed requests in this range.")
    with right:
        st.subheader("Time to first token")
        if ttft:
            st.altair_chart(charts.percentiles_over_time(ttft, regressions, "TTFT ms"), width="stretch")
        else:
            st.info("No TTFT measured in this range.")
    if regressions:
        st.caption("Shaded: windows where a drift run found a latency regression.")


def _what_if(f: Filters, workload: str) -> None:
    window = f.range
    st.subheader("What if γ were different?")
    inputs = data.speedup_inputs(f.url, workload, window.start, window.end)
    if inputs is None:
        st.info("No speculative requests with draft and verify timings in this range: nothing to estimate from.")
        return
    current = data.current_settings(f.url, window.start, window.end).get(workload)
    gamma = current.gamma if current is not None and current.gamma > 0 else inputs.gamma
    rows = [{"gamma": g, "speedup": inputs.speedup(g)} for g in range(1, max(8, gamma + 2) + 1)]
    st.altair_chart(charts.what_if_gamma(rows, gamma), width="stretch")
    best = max(rows, key=lambda r: r["speedup"])
    source = (
        "t₁ from plain/holdout requests"
        if inputs.t1_source == "holdout"
        else "t₁ from verification passes, verify cost per draft taken as 0 (optimistic)"
    )
    st.caption(
        f"Expected speedup (Leviathan et al., with verification cost) from the newest {inputs.requests:,} speculative "
        f"requests: α = {inputs.alpha:.3f}, c = {inputs.c:.3f}, b/t₁ = {inputs.b_over_t1:.3f} ({source}). "
        f"Current γ = {gamma} (diamond): ×{inputs.speedup(gamma):.2f}; "
        f"best γ = {best['gamma']}: ×{best['speedup']:.2f}. "
        "Below the red line speculation is slower than plain decoding."
    )


def body(f: Filters) -> None:
    if components.empty_state(f):
        return
    workload = _pick(f)
    if workload is None:
        return
    _kpis(f, workload)
    _acceptance(f, workload)
    _acceptance_shape(f, workload)
    _by_length(f, workload)
    _latency(f, workload)
    _what_if(f, workload)


components.live(body)
