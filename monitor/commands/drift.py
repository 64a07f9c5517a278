"""``draftwatch drift run|explain`` and ``draftwatch baseline pin|unpin``: drift tests from the command line."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from monitor.commands.common import add_settings_arguments, argument_type, iso_time, run_with_engine
from monitor.config import Settings
from monitor.settings.parsers import parse_duration

if TYPE_CHECKING:  # the statistics (scipy) load when a drift command runs, not when --help is read
    from sqlalchemy.engine import Engine

    from monitor.drift.explain import Explanation
    from monitor.drift.run import DriftRun
    from monitor.drift.windows import Windows

DURATION = argument_type(parse_duration)


def register(subparsers: Any) -> None:
    """Add the ``drift`` and ``baseline`` command groups."""
    drift = subparsers.add_parser("drift", help="drift and latency-regression tests")
    drift.set_defaults(handler=lambda _args: (drift.print_help(), 2)[1])
    drift_commands = drift.add_subparsers(dest="drift_command", metavar="DRIFT_COMMAND")
    run = drift_commands.add_parser("run", help="run every test once now, store and print the results")
    add_settings_arguments(run)
    run.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    run.add_argument("--current", type=DURATION, default=None, help="current window, e.g. 15m, 6h (default: 1h)")
    run.add_argument("--reference", type=DURATION, default=None, help="reference window before it (default: 1d)")
    run.add_argument("--now", type=iso_time, default=None, help="end of the current window (default: now)")
    run.add_argument("--all", action="store_true", help="table: also list no_drift and insufficient_data rows")
    run.add_argument("--no-alerts", action="store_true", help="do not raise alerts for this run")
    run.add_argument(
        "--fail-on-drift",
        action="store_true",
        help="exit with status 1 when any result is drift (for cron and CI gates); 0 otherwise",
    )
    run.set_defaults(handler=_run)
    explain = drift_commands.add_parser(
        "explain",
        help="why acceptance changed: the change split into mix and within-workload parts, with intervals",
        description=(
            "Split the change of pooled acceptance (accepted / drafted draft tokens) between the reference and the "
            "current window into 'mix' (the share of drafts moving between workloads) and 'within' each workload "
            "(its own rate moving), exactly: the parts add up to the change. A workload whose within part is named "
            "is split again over the factor groups that vary in it (length, sampling, style, content, version, "
            "health: a Shapley split of what their composition explains), the rest its own 'unexplained'. "
            "Intervals are 95 % request-level "
            "bootstrap intervals; a part is named (marked *) when Benjamini-Hochberg across the parts keeps it at "
            "q < drift.fdr_level (0.01), its interval excludes zero and it is at least 0.01. Workloads with fewer than "
            "drift.explain_min_requests drafting requests in a window are merged into 'other'; what still cannot be "
            "split is the 'unexplained' part, which says why. The windows are drift run's default ones; with "
            "--workload, the workload's own where drift run tests it over windows of its own (a pinned baseline, "
            "a version change, a current window widened at low volume), as its alert does."
        ),
    )
    add_settings_arguments(explain)
    explain.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    explain.add_argument(
        "--workload", default=None, help="only this workload's parts, over the windows its drift test compares"
    )
    explain.add_argument(
        "--metric",
        choices=("acceptance", "speed"),
        default="acceptance",
        help="split acceptance (default) or decode time per token (ms, speculative requests; its Level 2 adds the "
        "load, in-flight requests at the engine, and the requests' own acceptance)",
    )
    explain.add_argument("--current", type=DURATION, default=None, help="current window, e.g. 15m, 6h (default: 1h)")
    explain.add_argument("--reference", type=DURATION, default=None, help="reference window before it (default: 1d)")
    explain.add_argument("--now", type=iso_time, default=None, help="end of the current window (default: now)")
    explain.set_defaults(handler=_explain)

    baseline = subparsers.add_parser("baseline", help="pin or unpin a workload's drift reference window")
    baseline.set_defaults(handler=lambda _args: (baseline.print_help(), 2)[1])
    baseline_commands = baseline.add_subparsers(dest="baseline_command", metavar="BASELINE_COMMAND")
    pin = baseline_commands.add_parser("pin", help="use the reference window ending at TIME (default: now)")
    add_settings_arguments(pin)
    pin.add_argument("--workload", required=True, help="workload tag")
    pin.add_argument("--at", type=iso_time, default=None, help="end of the pinned window, ISO time (default: now)")
    pin.add_argument(
        "--reference",
        type=DURATION,
        default=None,
        help="its length (default: drift.reference_window)",
    )
    pin.set_defaults(handler=_pin)
    unpin = baseline_commands.add_parser("unpin", help="back to the rolling reference window")
    add_settings_arguments(unpin)
    unpin.add_argument("--workload", required=True, help="workload tag")
    unpin.set_defaults(handler=_unpin)


def _run(args: argparse.Namespace) -> int:
    from monitor.drift.run import run_drift

    def action(engine: Engine, settings: Settings) -> int:
        result = run_drift(engine, settings.drift, args.now, current=args.current, reference=args.reference)
        if not args.no_alerts:
            from monitor.alerts.evaluate import evaluate_alerts

            evaluate_alerts(engine, settings.alert_config, result.results)
        print(json.dumps(result.to_json(), indent=1) if args.json else format_table(result, everything=args.all))
        return 1 if args.fail_on_drift and result.drifts else 0

    return run_with_engine(args, "drift run", action)


def _explain(args: argparse.Namespace) -> int:
    from monitor.drift.run import explain_drift

    def action(engine: Engine, settings: Settings) -> int:
        from monitor.drift.explain import ACCEPTANCE, DECODE_SPEED

        windows, explanation = explain_drift(
            engine,
            settings.drift,
            args.now,
            current=args.current,
            reference=args.reference,
            workload=args.workload,
            metric=DECODE_SPEED if args.metric == "speed" else ACCEPTANCE,
        )
        print(json.dumps(explanation.to_json(), indent=1) if args.json else format_split(windows, explanation))
        return 0

    return run_with_engine(args, "drift explain", action)


def format_split(windows: Windows, e: Explanation) -> str:
    """A readable table of the split: one line per part (* named), the sentence last."""

    def number(value: float | None) -> str:
        return f"{value:+.3f}" if value is not None and value == value else "-"

    def interval(low: float | None, high: float | None) -> str:
        return f"[{low:+.3f}, {high:+.3f}]" if low is not None and high is not None and low == low else ""

    lines = [
        f"{e.metric.title.lower()} split  "
        f"reference {windows.ref_start:%Y-%m-%d %H:%M} .. {windows.ref_end:%Y-%m-%d %H:%M}  "
        f"current {windows.cur_start:%Y-%m-%d %H:%M} .. {windows.cur_end:%Y-%m-%d %H:%M} UTC"
        + (f"  ({windows.note})" if windows.note else ""),
        f"  {'cause':<12} {'workload':<16} {'value':>8}  interval",
        f"  {'change':<12} {'*':<16} {number(e.change):>8}  {interval(e.low, e.high)}",
    ]
    for p in e.parts:
        mark = "*" if p.named else " "
        reason = f"  ({p.detail['reason']})" if "reason" in p.detail else ""
        lines.append(
            f"{mark} {p.cause:<12} {(p.workload or '-'):<16.16} {number(p.value):>8}  {interval(p.low, p.high)}{reason}"
        )
    from monitor.drift.explain import sentence

    lines.append(sentence(e))
    return "\n".join(lines)


def format_table(run: DriftRun, *, everything: bool = False) -> str:
    """A readable table: drift rows always, the rest with ``everything``; a count line at the end."""
    w = run.windows
    lines = [
        f"drift run {run.run_id}  reference {w.ref_start:%Y-%m-%d %H:%M} .. {w.ref_end:%Y-%m-%d %H:%M}  "
        f"current .. {w.cur_end:%Y-%m-%d %H:%M} UTC  (BH level {run.level})",
        f"{'decision':<17} {'test':<17} {'workload':<16} {'metric':<22} {'n_ref':>6} {'n_cur':>6} "
        f"{'q':>9} {'effect':>8}  ci",
    ]
    shown = [r for r in run.results if everything or r.decision == "drift"]
    for r in shown:
        q = f"{r.q:.2g}" if r.q is not None else "-"
        effect = f"{r.effect:+.3f}" if r.effect is not None else "-"
        ci = f"[{r.ci[0]:.3f}, {r.ci[1]:.3f}]" if r.ci else ""
        note = f"  ({r.note})" if r.note else ""
        lines.append(
            f"{r.decision:<17} {r.test:<17} {(r.workload or '*'):<16.16} {r.metric:<22.22} {r.n_ref:>6} {r.n_cur:>6} "
            f"{q:>9} {effect:>8}  {ci}{note}"
        )
    counts = {d: sum(r.decision == d for r in run.results) for d in ("drift", "no_drift", "insufficient_data")}
    lines.append(", ".join(f"{n} {d}" for d, n in counts.items()) + ("" if everything else "  (--all lists every row)"))
    return "\n".join(lines)


def _pin(args: argparse.Namespace) -> int:
    from monitor.drift.queries import pin_baseline

    def action(engine: Engine, settings: Settings) -> int:
        length = args.reference or settings.drift.reference_window
        start, end = pin_baseline(engine, args.workload, at=args.at, length=length)
        print(f"workload {args.workload}: reference pinned to {start.isoformat()} .. {end.isoformat()}")
        return 0

    return run_with_engine(args, "baseline pin", action)


def _unpin(args: argparse.Namespace) -> int:
    from monitor.drift.queries import unpin_baseline

    def action(engine: Engine, _settings: Settings) -> int:
        cleared = unpin_baseline(engine, args.workload)
        print(f"workload {args.workload}: {cleared} pin(s) cleared, rolling reference")
        return 0

    return run_with_engine(args, "baseline unpin", action)
