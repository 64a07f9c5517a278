"""``draftwatch ledger``: what speculation saved or cost per workload and load level, and what to set in the engine."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from monitor.commands.common import add_settings_arguments, argument_type, iso_time, run_with_engine
from monitor.config import Settings
from monitor.drift.settings import parse_price
from monitor.settings.parsers import parse_duration

if TYPE_CHECKING:  # the statistics (scipy) load when the command runs, not when --help is read
    from sqlalchemy.engine import Engine

    from monitor.drift.detectors.ledger import Ledger

DURATION = argument_type(parse_duration)
PRICE = argument_type(parse_price)


def register(subparsers: Any) -> None:
    """Add the ``ledger`` command."""
    ledger = subparsers.add_parser(
        "ledger",
        help="what speculation saved or cost per workload and load level, the load crossover, the engine setting",
        description=(
            "Per workload and pair, the decode speed ratio plain / speculative (above 1: speculation is faster) per "
            "load level (requests in flight at the replica, doubling levels merged until each has drift.min_requests "
            "a side), each with a 95 % request-level bootstrap interval; the crossover (the lowest load where "
            "speculation loses, with the bracket it lies in) or none seen; and the bill: replica-seconds saved "
            "(negative: lost) by the speculative decode tokens of the window against serving them plain at the same "
            "load, and money at a price per replica-hour per pool. A level whose interval spans 1 is inconclusive; "
            "a level without a ratio leaves its tokens unvalued."
        ),
    )
    add_settings_arguments(ledger)
    ledger.add_argument(
        "--window", type=DURATION, default=timedelta(days=1), help="how far back, e.g. 6h, 7d (default: 24h)"
    )
    ledger.add_argument("--now", type=iso_time, default=None, help="end of the window, ISO time (default: now)")
    ledger.add_argument(
        "--price",
        type=PRICE,
        action="append",
        default=[],
        metavar="POOL=USD_PER_HOUR",
        help="price of a replica-hour in a pool, speculative or baseline (repeat for each); money needs both",
    )
    ledger.add_argument("--workload", default=None, help="only this workload")
    ledger.add_argument(
        "--engine-settings",
        action="store_true",
        help="print each engine's setting that turns speculation off above the measured crossover, with the evidence",
    )
    ledger.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ledger.set_defaults(handler=_ledger)


def _ledger(args: argparse.Namespace) -> int:
    from monitor.drift.detectors.ledger import read_ledger

    def action(engine: Engine, settings: Settings) -> int:
        end = args.now or datetime.now(UTC)
        prices = dict(args.price)
        found = read_ledger(engine, settings.drift, end - args.window, end, prices, workload=args.workload)
        if args.workload is not None and not found.workloads and not args.json:
            print(f"workload {args.workload!r}: no speculative request between {found.start:%Y-%m-%d %H:%M} and "
                  f"{found.end:%Y-%m-%d %H:%M} UTC")  # fmt: skip
            return 0
        if args.engine_settings:
            print(json.dumps(settings_json(found), indent=1) if args.json else format_settings(found))
        else:
            print(json.dumps(found.to_json(), indent=1) if args.json else format_ledger(found))
        return 0

    return run_with_engine(args, "ledger", action)


def _number(value: float | None, form: str = "+.1f") -> str:
    return "-" if value is None else format(value, form)


def format_ledger(ledger: Ledger) -> str:
    """A readable table: one line per workload and level, the workload's total and note, the grand total."""
    lines = [f"speculation ledger  {ledger.start:%Y-%m-%d %H:%M} .. {ledger.end:%Y-%m-%d %H:%M} UTC"]
    if not ledger.workloads:
        lines.append("nothing to bill: no speculative request in the window")
        return "\n".join(lines)
    if len(ledger.prices) < 2:
        lines.append("no money figures: give --price speculative=USD_PER_HOUR --price baseline=USD_PER_HOUR")
    lines.append(
        f"  {'workload':<16} {'in flight':>9} {'ratio':>6} {'interval':>15} {'n_spec':>6} {'n_plain':>7} "
        f"{'tokens':>9} {'gpu_s saved':>11} {'usd':>8}  call"
    )
    for w in ledger.workloads:
        for b in w.bills:
            lv = b.level
            span = f"{lv.inflight_low}-{lv.inflight_high}"
            interval = f"[{lv.low:.2f}, {lv.high:.2f}]" if lv.low is not None and lv.high is not None else ""
            lines.append(
                f"  {w.workload:<16.16} {span:>9} {_number(lv.ratio, '.2f'):>6} {interval:>15} {lv.n_spec:>6} "
                f"{lv.n_plain:>7} {b.tokens:>9} {_number(b.seconds):>11} {_number(b.usd, '+.4f'):>8}  "
                f"{lv.call if lv.measured else lv.note}"
            )
        t = w.totals
        lines.append(
            f"  {w.workload:<16.16} {'total':>9} {'':>6} {_interval(t.low, t.high):>15} {'':>6} {'':>7} {t.tokens:>9} "
            f"{_number(t.seconds):>11} {_number(t.usd, '+.4f'):>8}  {_call(t.low, t.high)}"
        )
        lines.append(f"    {w.pair.label}: {w.note}")
    t = ledger.total
    lines.append(
        f"total: {_number(t.seconds)} GPU-seconds saved {_interval(t.low, t.high)}, {_number(t.usd, '+.4f')} USD, "
        f"{t.tokens} speculative tokens ({t.tokens_unvalued} unvalued): {_call(t.low, t.high)}"
    )
    return "\n".join(lines)


def _interval(low: float | None, high: float | None) -> str:
    return f"[{low:+.1f}, {high:+.1f}]" if low is not None and high is not None else ""


def _call(low: float | None, high: float | None) -> str:
    from monitor.drift.detectors.ledger import call_of

    return call_of(low, high)


def settings_json(ledger: Ledger) -> dict[str, Any]:
    from monitor.drift.detectors.knobs import engine_settings, evidence

    return {
        "workloads": [
            {
                "workload": w.workload,
                "pair": w.pair.label,
                "crossover": w.curve.crossover.to_json() if w.curve.crossover else None,
                "note": w.note,
                "settings": [s.to_json() for s in engine_settings(w.curve)],
                "evidence": evidence(w.curve),
            }
            for w in ledger.workloads
        ]
    }


def format_settings(ledger: Ledger) -> str:
    from monitor.drift.detectors.knobs import engine_settings, evidence

    if not ledger.workloads:
        return "nothing measured: no speculative request in the window"
    lines: list[str] = []
    for w in ledger.workloads:
        lines.append(f"{w.workload} ({w.pair.label}): {w.note}")
        advice = engine_settings(w.curve)
        if not advice:
            lines.append("  no setting: no load level was measured")
        for s in advice:
            lines.append(f"  {s.engine:<16} {s.setting}   ({s.meaning}; {s.source})")
        for e in evidence(w.curve):
            lines.append(
                f"    evidence: {e['inflight_low']}-{e['inflight_high']} in flight: ratio {e['ratio']:.2f} "
                f"[{e['low']:.2f}, {e['high']:.2f}], {e['n_spec']} speculative / {e['n_plain']} plain, {e['call']}"
            )
    return "\n".join(lines)
