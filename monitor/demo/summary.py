"""The demo's closing summary: acceptance and speedup before and after, the drift finding, why, the alert."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Engine

from monitor.demo.receiver import Delivery
from monitor.demo.scenario import Scenario
from monitor.demo.traffic import Traffic
from monitor.drift.queries import latest_results, latest_run
from monitor.drift.result import DriftResult


def _rate(value: float | None) -> str:
    return "  n/a" if value is None else f"{value:5.2f}"


def _speedup(value: float | None) -> str:
    return "  n/a" if value is None else f"{value:5.2f}x"


def finding_line(result: DriftResult) -> str:
    """One finding; estimates and the online detector decide without a p-value, so theirs reads n/a."""
    ci = f"[{result.ci[0]:+.3f}, {result.ci[1]:+.3f}]" if result.ci else "n/a"
    effect, p, q = ("n/a" if v is None else f"{v:{spec}}" for v, spec in
                    ((result.effect, "+.3f"), (result.p, ".2g"), (result.q, ".2g")))  # fmt: skip
    return (
        f"  {result.test}/{result.metric}: effect {effect} (95% CI {ci}), "
        f"p={p}, q={q}, n_ref={result.n_ref}, n_cur={result.n_cur}" + (f" — {result.note}" if result.note else "")
    )


def traffic_table(scenario: Scenario, before: Traffic, after: Traffic) -> list[str]:
    """The summary's table: per workload, requests, acceptance and decode speedup before and after the change."""
    lines = [f"{'workload':12} {'requests':>9} {'acceptance before':>18} {'after':>7}   decode speedup before / after"]
    for workload in scenario.workloads:
        lines.append(
            f"{workload:12} {before.requests.get(workload, 0):>4} / {after.requests.get(workload, 0):<4}"
            f" {_rate(before.acceptance(workload)):>18} {_rate(after.acceptance(workload)):>7}"
            f"   {_speedup(before.speedup(workload)):>14} / {_speedup(after.speedup(workload))}"
        )
    return lines


def split_lines(split: dict[str, Any], workload: str) -> list[str]:
    """The latest run's acceptance split: its sentence, then each part about ``workload`` or the whole mix.

    >>> split = {"detail": {"summary": "Acceptance fell 0.30 (0.60 -> 0.30): ..."}, "parts": [
    ...     {"cause": "content", "workload": "extract", "value": -0.25, "low": -0.3, "high": -0.2,
    ...      "detail": {"named": True, "lead": "copy share <10 %"}},
    ...     {"cause": "unexplained", "workload": "extract", "value": -0.05, "low": -0.1, "high": 0.0,
    ...      "detail": {"named": False}}]}
    >>> print("\\n".join(split_lines(split, "extract")))
      Acceptance fell 0.30 (0.60 -> 0.30): ...
      * content      -0.250 [-0.300, -0.200]  copy share <10 %
        unexplained  -0.050 [-0.100, +0.000]
    """
    lines = [f"  {split['detail']['summary']}"]
    for p in split["parts"]:
        if p["workload"] not in (None, workload) or p["value"] is None:
            continue
        interval = f"[{p['low']:+.3f}, {p['high']:+.3f}]" if p["low"] is not None and p["high"] is not None else ""
        lead = f"  {p['detail']['lead']}" if "lead" in p["detail"] else ""
        mark = "*" if p["detail"].get("named") else " "
        lines.append(f"  {mark} {p['cause']:<12} {p['value']:+.3f} {interval}{lead}".rstrip())
    return lines


def print_summary(
    engine: Engine,
    scenario: Scenario,
    before: Traffic,
    after: Traffic,
    alert: Delivery | None,
    dashboard_url: str | None,
) -> None:
    print("\n==================== draftwatch demo: summary ====================")
    print(f"change: {scenario.change_description}\n")
    print("\n".join(traffic_table(scenario, before, after)))
    print(
        "\ndecode speedup: mean decode ms per token ((latency - TTFT) / (output tokens - 1), per request) of the "
        "holdout\nrequests over that of the speculative ones; n/a until both modes have a request"
    )
    findings = [r.result for r in latest_results(engine, workload=scenario.changed) if r.result.decision == "drift"]
    print("\ndrift findings of the latest run for workload", repr(scenario.changed) + ":")
    if not findings:
        print("  none yet (see `draftwatch drift run --all`)")
    for result in findings:
        print(finding_line(result))
    run = latest_run(engine)
    if run is not None and run.acceptance_split is not None:
        # The changed workload's reference is pinned to the traffic before the change: its own split compares that.
        split = run.acceptance_split.get("workloads", {}).get(scenario.changed, run.acceptance_split)
        print("\nwhy acceptance changed (the latest run's split, * named; `draftwatch drift explain "
              f"--workload {scenario.changed}` prints it too):")  # fmt: skip
        print("\n".join(split_lines(split, scenario.changed)))
    if alert is None:
        print("\nno acceptance alert arrived in time: check the sidecar log in the demo directory")
    else:
        print(f"\nalert received by the local webhook receiver (signature verified, webhook-id {alert.webhook_id}):")
        for item in alert.payload.get("alerts", []):
            print(f"  [{item.get('status')}] {item.get('labels')}")
            annotations = item.get("annotations", {})
            print(f"      {annotations.get('summary', '')}")
            if annotations.get("description"):
                print(f"      {annotations['description']}")
    if dashboard_url:
        print(f"\ndashboard: {dashboard_url}")
