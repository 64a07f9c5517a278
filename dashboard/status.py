"""One Overview row per workload, and its status: pure functions over query results (no Streamlit).

Status, first match wins:

* ``net loss``: speculation is slower than plain decoding: the measured speedup (holdout in the
  range) or, with too little holdout, the newest drift run's net-loss figure (else the cost-model
  estimate) is below 1, or the newest drift run's net-loss test said so;
* ``regression``: the newest drift run found a latency regression for the workload;
* ``drift``: the newest drift run found any other drift (acceptance, prompt length, the online
  detector);
* ``insufficient data``: fewer than :data:`MIN_REQUESTS` requests in the range;
* ``ok``.

>>> row = OverviewRow("code", 100, 0.8, 0.05, 3.1, 1.4, "measured", 9.0, -0.02, 4, "speculative")
>>> status_of(row, [])
'ok'
>>> status_of(row.replace(speedup=0.9), []), status_of(row.replace(requests=5), [])
('net loss', 'insufficient data')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from monitor.drift.queries import StoredResult
from monitor.drift.verdict import NOT_TESTED, busiest, verdict_of
from monitor.store.reads.dashboard import CurrentSetting, SpeedupInputs
from monitor.store.reads.results import WorkloadSummary

# Matches the drift tests' default minimum sample (drift.min_requests): below it nothing is concluded.
MIN_REQUESTS: Final = 30
STATUSES: Final = ("net loss", "regression", "drift", "insufficient data", "ok")
VERDICT_LABELS: Final = {
    "pays": "yes: pays",
    "net_loss": "no: net loss",
    "inconclusive": "inconclusive",
    "not_measured": "not measured",
}
BADGES: Final = {
    "net loss": "🔴 net loss",
    "regression": "🟠 regression",
    "drift": "🟡 drift",
    "insufficient data": "⚪ insufficient data",
    "ok": "🟢 ok",
}


@dataclass(frozen=True, slots=True)
class OverviewRow:
    workload: str
    requests: int
    acceptance: float | None
    acceptance_change: float | None  # points (fraction) against the reference window
    mean_acceptance_length: float | None
    speedup: float | None
    speedup_source: str  # "measured", "measured (drift run)", "estimated (drift run)", "estimated" (cost model) or "—"
    p95_ms_per_token: float | None
    p95_change: float | None  # relative change against the reference window
    gamma: int | None
    mode: str | None
    status: str = "ok"
    findings: str = ""
    # Is speculation paying: the newest drift run's verdict (monitor.drift.verdict) and why.
    verdict: str = "not_measured"
    verdict_reason: str = NOT_TESTED

    def replace(self, **changes: Any) -> OverviewRow:
        return dataclasses.replace(self, **changes)


def _diff(now: float | None, before: float | None) -> float | None:
    return None if now is None or before is None else now - before


def _relative(now: float | None, before: float | None) -> float | None:
    return None if now is None or not before else now / before - 1.0


def _finding_list(findings: Sequence[StoredResult]) -> str:
    return ", ".join(sorted({f"{f.result.test}:{f.result.metric}" for f in findings if f.result.decision == "drift"}))


def status_of(row: OverviewRow, findings: Sequence[StoredResult]) -> str:
    """The row's status from its figures and the newest drift run's findings for its workload."""
    drifted = {f.result.test for f in findings if f.result.decision == "drift"}
    if (row.speedup is not None and row.speedup < 1.0) or "net_loss" in drifted:
        return "net loss"
    if "latency" in drifted:
        return "regression"
    if drifted:
        return "drift"
    if row.requests < MIN_REQUESTS:
        return "insufficient data"
    return "ok"


def overview_rows(
    current: Sequence[WorkloadSummary],
    reference: Sequence[WorkloadSummary],
    settings: dict[str, CurrentSetting],
    estimates: dict[str, SpeedupInputs | None],
    findings: Sequence[StoredResult],
) -> list[OverviewRow]:
    """Rows in the order of ``current``; the measured speedup wins once holdout has enough requests."""
    before = {s.workload: s for s in reference}
    rows = []
    for s in current:
        ref = before.get(s.workload)
        setting = settings.get(s.workload)
        mine = [f for f in findings if f.result.workload == s.workload]
        speedup, source = None, "—"
        if s.measured_speedup is not None and s.holdout_requests >= MIN_REQUESTS:
            speedup, source = s.measured_speedup, "measured"
        elif (drift := _net_loss(mine)) is not None:
            speedup, source = drift
        elif (est := estimates.get(s.workload)) is not None:
            gamma = setting.gamma if setting is not None and setting.gamma > 0 else est.gamma
            speedup, source = est.speedup(gamma), "estimated"
        row = OverviewRow(
            workload=s.workload,
            requests=s.requests,
            acceptance=s.acceptance_rate_tokens,
            acceptance_change=_diff(s.acceptance_rate_tokens, ref.acceptance_rate_tokens if ref else None),
            mean_acceptance_length=s.mean_acceptance_length,
            speedup=speedup,
            speedup_source=source,
            p95_ms_per_token=s.ms_per_token_p95,
            p95_change=_relative(s.ms_per_token_p95, ref.ms_per_token_p95 if ref else None),
            # A request that drafted nothing says nothing of γ (a proxied engine reports none): unknown, not 0.
            gamma=setting.gamma if setting and setting.gamma > 0 else None,
            mode=setting.mode if setting else None,
            findings=_finding_list(mine),
            **_verdict(mine),
        )
        rows.append(row.replace(status=status_of(row, mine)))
    return rows


def _net_loss(findings: Sequence[StoredResult]) -> tuple[float, str] | None:
    """The newest drift run's speedup for the workload: decode speed against plain decoding, like for like.

    Preferred to the cost-model estimate: it measures what speculation cost, drafter and
    verification overheads included (docs/statistics.md, *Net loss*).
    """
    for found in findings:
        r = found.result
        if r.test == "net_loss" and r.decision != "insufficient_data" and r.effect is not None:
            return r.effect, "estimated (drift run)" if r.detail.get("estimate") else "measured (drift run)"
    return None


def _verdict(findings: Sequence[StoredResult]) -> dict[str, str]:
    """The verdict of the workload's busiest pair; not measured (and how to measure it) without a net-loss result."""
    # The findings are one workload's: at most one verdict is left.
    chosen = busiest(verdict_of(f.result) for f in findings if f.result.test == "net_loss")
    return {"verdict": v.verdict, "verdict_reason": v.reason} if (v := next(iter(chosen.values()), None)) else {}


def table(rows: Sequence[OverviewRow]) -> list[dict[str, Any]]:
    """The rows as the Overview's table shows them (values raw; formats are the column config's).

    A figure nobody reported stays None, shown as the table's placeholder dash; γ is text, empty when unknown.
    """
    return [
        {
            "Workload": r.workload,
            "Status": BADGES[r.status],
            "Requests": r.requests,
            "Acceptance": r.acceptance,
            "Δ acceptance (pts)": None if r.acceptance_change is None else r.acceptance_change * 100,
            "Mean accept. length": r.mean_acceptance_length,
            "Speedup": r.speedup,
            "Speedup is": r.speedup_source,
            "Pays?": VERDICT_LABELS[r.verdict],
            "Why": r.verdict_reason,
            "p95 ms/token": r.p95_ms_per_token,
            "Δ p95": r.p95_change,
            "γ": "" if r.gamma is None else str(r.gamma),
            "Mode": r.mode or "—",
            "Findings": r.findings or "—",
        }
        for r in rows
    ]
