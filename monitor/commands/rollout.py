"""``draftwatch rollout start|status|promote|abort``: a candidate drafter staged on live traffic, from the command line.

The rollout itself is :mod:`monitor.proxy.rollout`'s: these commands start one, show what the
scheduler's judge decided, and promote or abort one by hand. A refusal (:class:`RolloutError`, an
unknown id) is one line on stderr saying what was wrong and what to do, exit status 2, as a bad
setting is; a database that fails is status 1 (:func:`run_with_engine`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from monitor.commands.common import add_settings_arguments, argument_type, run_with_engine
from monitor.config import Settings
from monitor.proxy.settings import RolloutSettings, parse_steps
from monitor.settings.parsers import format_duration, parse_duration, parse_int, parse_str

if TYPE_CHECKING:  # the database layer and the judge's statistics load when a command runs, not when --help is read
    from sqlalchemy.engine import Engine

    from monitor.store.rollouts import Rollout, RolloutEvent

# monitor.store.rollouts.STATUSES, spelled out here so that --help loads no database layer (a test holds them equal).
STATUSES: Final = ("running", "promoted", "rolled_back", "aborted")
MAX_ID: Final = 2**63 - 1  # ids are BIGINT

STEPS = argument_type(parse_steps)
DURATION = argument_type(parse_duration)
ROUTE = argument_type(parse_int(1))
ROLLOUT_ID = argument_type(parse_int(1, MAX_ID))
NAME = argument_type(parse_str)


def register(subparsers: Any) -> None:
    """Add the ``rollout`` command group."""
    rollout = subparsers.add_parser(
        "rollout",
        help="roll a new drafter out on live traffic, step by step, judged per workload against the current one",
        description="A rollout sends a rising share of a deployment's speculative requests to its candidate pool "
        "(proxy.candidate_upstream: the same target served with the new drafter), or, in the embedded decoder, to "
        "its candidate drafter (decoder.candidate: serve --candidate-drafter). The scheduler's rollout job "
        "judges each step per workload against the current drafter's requests of the same interval, and advances, "
        "holds, promotes or rolls it back by itself; promote and abort decide by hand.",
    )
    rollout.set_defaults(handler=lambda _args: (rollout.print_help(), 2)[1])
    commands = rollout.add_subparsers(dest="rollout_command", metavar="ROLLOUT_COMMAND")

    start = commands.add_parser(
        "start",
        help="start a rollout on a deployment with a candidate pool",
        description="Start a rollout of the candidate drafter on the default deployment (or --route N's): every "
        "sidecar with the candidate pool sends the first step's share of the speculative requests there within "
        "proxy.route_refresh_s, stored under the drafter's name. Each flag overrides its rollout.* setting for "
        "this rollout. Refused (exit status 2) where the deployment has no candidate pool or already has a running "
        "or promoted rollout.",
    )
    add_settings_arguments(start)
    start.add_argument("--route", type=ROUTE, default=None, metavar="N",
                       help="roll out on the deployment of the Nth [[proxy.routes]] table (1 is the first), "
                            "with its candidate_upstream (default: the default deployment, "
                            "proxy.candidate_upstream)")  # fmt: skip
    start.add_argument("--candidate", default=None, metavar="URL",
                       help="a URL that must be in the deployment's candidate pool: the rollout is refused "
                            "otherwise (its share goes to the whole pool)")  # fmt: skip
    start.add_argument("--steps", type=STEPS, default=None, metavar="PERCENTS",
                       help="the candidate's share of the speculative requests at each step, in percent, rising to "
                            "100, e.g. 5,25,50,100 (default: rollout.steps)")  # fmt: skip
    start.add_argument("--interval", type=DURATION, default=None, metavar="DURATION",
                       help="how long a step lasts before it may advance, e.g. 30m, 2h "
                            "(default: rollout.interval)")  # fmt: skip
    start.add_argument("--per-workload", action=argparse.BooleanOptionalAction, default=None,
                       help="keep a failing workload on the current drafter and go on with the others, and promote "
                            "the candidate only where it passed; --no-per-workload: one failure rolls everything "
                            "back (default: rollout.per_workload)")  # fmt: skip
    start.add_argument("--drafter", type=NAME, default=None, metavar="NAME",
                       help="the name the candidate's requests are stored under, e.g. eagle3-v2 "
                            "(default: rollout.drafter)")  # fmt: skip
    start.set_defaults(handler=_start)

    status = commands.add_parser(
        "status",
        help="the rollouts and the judge's newest word per workload; with ID its events as a timeline",
        description="Without ID: the rollouts, newest first, each with its status, its step and share, and per "
        "workload the judge's newest outcome (pass, marginal, fail, unjudged), score (the share of judged metrics "
        "passing, 0-100), decode speed (the candidate's over the current drafter's, above 1x faster, with its "
        "interval) and the requests judged on each side. With ID: that rollout and every step, hold, kept "
        "workload, promotion or rollback, oldest first.",
    )
    add_settings_arguments(status)
    status.add_argument("id", type=ROLLOUT_ID, nargs="?", default=None, metavar="ID",
                        help="a rollout's id (default: list them)")  # fmt: skip
    status.add_argument("--status", action="append", choices=STATUSES, default=None,
                        help="without ID: only rollouts with this status (repeatable; default: all)")  # fmt: skip
    status.add_argument("--limit", type=argument_type(parse_int(1, 5000)), default=20,
                        help="without ID: at most this many rollouts (default: %(default)s)")  # fmt: skip
    status.add_argument("--json", action="store_true", help="print JSON, as GET /v1/rollouts[/ID] answers")
    status.set_defaults(handler=_status)

    promote = commands.add_parser(
        "promote",
        help="promote a running rollout now: the candidate serves every workload not kept on the current drafter",
        description="Promote a running rollout by hand, whatever step it is at: the candidate pool serves all of "
        "the deployment's speculative requests but those of workloads already kept on the current drafter. To "
        "finish, make the candidate the deployment's --upstream, then end the rollout with draftwatch rollout "
        "abort ID.",
    )
    add_settings_arguments(promote)
    promote.add_argument("id", type=ROLLOUT_ID, metavar="ID", help="the rollout's id (see draftwatch rollout status)")
    promote.set_defaults(handler=_promote)

    abort = commands.add_parser(
        "abort",
        help="end a running or promoted rollout: every request back to the current drafter",
        description="End a running or promoted rollout now: every sidecar sends the deployment's requests to the "
        "current drafter again within proxy.route_refresh_s, and a new rollout may start.",
    )
    add_settings_arguments(abort)
    abort.add_argument("id", type=ROLLOUT_ID, metavar="ID", help="the rollout's id (see draftwatch rollout status)")
    abort.add_argument("--reason", type=NAME, default="aborted by hand", metavar="TEXT",
                       help="why, kept with the rollout and its event (default: %(default)s)")  # fmt: skip
    abort.set_defaults(handler=_abort)


def _start(args: argparse.Namespace) -> int:
    from monitor.proxy.rollout import RolloutError, staged_for, start_staged
    from monitor.settings.masking import mask_urls

    def action(engine: Engine, settings: Settings) -> int:
        flags = {"steps": args.steps, "interval": args.interval, "per_workload": args.per_workload,
                 "drafter": args.drafter}  # fmt: skip
        chosen = dataclasses.replace(settings.rollout, **{k: v for k, v in flags.items() if v is not None})
        now, embedded = datetime.now(UTC), settings.decoder.candidate
        try:
            staged = staged_for(engine, settings.proxy, now, args.route, embedded)
            r = start_staged(engine, staged, chosen, now, candidate=args.candidate)
        except RolloutError as error:
            print(f"draftwatch rollout start: {error}", file=sys.stderr)
            return 2
        print(f"rollout {r.id} started: drafter {r.drafter} on deployment {r.deployment!r} (candidate pool "
              f"{mask_urls(' '.join(staged.pool))}, {staged.where}), steps {_percents(r.steps)}, "
              f"{_duration(r.interval_s)} a step{', per workload' if r.per_workload else ''}")  # fmt: skip
        print(f"step 1 sends {_percent(r.step_share)} of the speculative requests to the candidate; the scheduler "
              f"judges it every {format_duration(settings.scheduler.rollout_interval)} "
              "(scheduler.rollout_interval) and advances, holds, promotes or rolls it back by itself")  # fmt: skip
        print(f"  draftwatch rollout status {r.id}     its steps and the judge's newest word per workload")
        print(f"  draftwatch rollout promote {r.id}    promote the candidate now")
        print(f"  draftwatch rollout abort {r.id}      every request back to the current drafter")
        print("\n".join(paced(engine, r, chosen, now)))
        return 0

    return run_with_engine(args, "rollout start", action)


def paced(engine: Engine, r: Rollout, settings: RolloutSettings, now: datetime) -> list[str]:
    """How long each step lasts at the deployment's traffic of the last day, what ``rollout.min_requests`` needs,
    and a warning for each workload a step cannot judge in time (:mod:`monitor.proxy.pace`)."""
    from monitor.proxy.pace import longest_s, needed, pace

    least, per = settings.min_requests, _duration(r.interval_s)
    needs = [f"{needed(share, least):.0f} at {_percent(share)}" for share in r.steps[:-1]]
    needs[0] = needs[0].replace(" at ", f" requests per {per} at ", 1)
    minimum = f"to be judged within one step a workload needs {', '.join(needs)} ({least} a side)"
    per_step, span = _traffic(engine, r, now)
    if not per_step:
        return [f"no requests with a decode time on deployment {r.deployment!r} in the last day: its steps cannot be "
                f"timed; {minimum}"]  # fmt: skip
    rates = {w: n / r.interval_s for w, n in per_step.items()}
    steps = pace(rates, r.steps, r.interval_s, least, settings.max_holds, r.per_workload)
    longest = longest_s(r.interval_s, settings.max_holds)
    within = f"{least} requests a side within {_eta(longest)} (a step and rollout.max_holds {settings.max_holds} more)"
    lines = [f"at the traffic of the last {_eta(span)} (requests with a decode time), each step takes:",
             f"  {'workload':<16} {'per ' + per:>10}" + "".join(f" {_percent(s.share):>9}" for s in steps)]  # fmt: skip
    warnings = []
    for w, n in per_step.items():
        cells = [_eta(s.reach_s[w]) if s.judged(w) else "unjudged" if s.reach_s[w] < longest else "never"
                 for s in steps]  # fmt: skip
        lines.append(f"  {w:<16.16} {n:>10.0f}" + "".join(f" {cell:>9}" for cell in cells))
        late = [s.share for s in steps if s.reach_s[w] >= longest]
        if late:
            short = ", ".join(f"{needed(share, least) * r.interval_s / longest:.0f}" for share in late)
            warnings.append(f"warning: {w} ({n:.0f} per {per}) reaches no decision at {', '.join(map(_percent, late))}"
                            f": {within} needs {short} per {per}")  # fmt: skip
        if not any(s.judged(w) for s in steps):
            fate = "stays on the current drafter" if r.per_workload else "would be promoted with the rest, unjudged"
            warnings.append(f"warning: {w} is judged at no step at this traffic: it {fate}")
    lines.append(f"  {'the step lasts':<27}" + "".join(f" {_eta(s.lasts_s) if s.lasts_s else 'rollback':>9}"
                                                       for s in steps))  # fmt: skip
    lines.append(f"  {minimum}")
    warnings += [f"warning: at {_percent(s.share)} no workload reaches {within}: the rollout would roll back there"
                 for s in steps if s.lasts_s is None]  # fmt: skip
    if warnings:
        warnings.append("  to judge them: fewer steps at larger shares (--steps), a longer --interval, or a lower "
                        "rollout.min_requests")  # fmt: skip
    return lines + warnings


def _traffic(engine: Engine, r: Rollout, now: datetime) -> tuple[dict[str, float], float]:
    """Per workload of ``r``'s deployment, busiest first, the requests with a decode time its current side served
    per step interval over the last day (or since the first), and the seconds they were counted over."""
    from fnmatch import fnmatchcase

    from monitor.proxy.pace import WINDOW
    from monitor.store.rollouts import timed_traffic

    with engine.connect() as conn:
        seen = timed_traffic(conn, r.current_drafters, now - WINDOW, now)
    counts: dict[str, int] = {}
    first = now
    for (workload, target), (n, since) in seen.items():
        if fnmatchcase(target, r.deployment):  # the default deployment, *, matches every target
            counts[workload] = counts.get(workload, 0) + n
            first = min(first, since)
    span = max((now - first).total_seconds(), 60.0)  # a minute's rollup at least, however recent its first request
    busiest = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return {w: n * r.interval_s / span for w, n in busiest}, span


def _status(args: argparse.Namespace) -> int:
    from monitor.store.rollouts import get_rollout, rollout_events, rollouts

    def action(engine: Engine, _settings: Settings) -> int:
        if args.id is None:
            found = rollouts(engine, status=args.status or STATUSES, limit=args.limit)
            if args.json:
                print(json.dumps({"rollouts": [r.to_json() for r in found]}, indent=1))
                return 0
            for r in found:
                print("\n".join(describe(r)))
            print(f"{len(found)} rollout(s)" if found else "no rollouts; draftwatch rollout start starts one")
            return 0
        rollout = get_rollout(engine, args.id)
        if rollout is None:
            print(f"draftwatch rollout status: no rollout {args.id}: draftwatch rollout status lists them",
                  file=sys.stderr)  # fmt: skip
            return 2
        events = rollout_events(engine, rollout_id=args.id)
        if args.json:
            print(json.dumps({**rollout.to_json(), "events": [e.to_json() for e in events]}, indent=1))
            return 0
        print("\n".join([*describe(rollout), *timeline(rollout, events)]))
        return 0

    return run_with_engine(args, "rollout status", action)


def _promote(args: argparse.Namespace) -> int:
    from monitor.proxy.rollout import RolloutError, promote

    def action(engine: Engine, _settings: Settings) -> int:
        try:
            r = promote(engine, args.id, datetime.now(UTC))
        except RolloutError as error:
            print(f"draftwatch rollout promote: {error}", file=sys.stderr)
            return 2
        kept = sorted(w for w, side in r.workloads.items() if side == "current")
        rest = f"every workload but {', '.join(kept)} (kept on the current drafter)" if kept else "every workload"
        print(f"rollout {r.id} promoted: {r.drafter} serves {rest} of deployment {r.deployment!r}")
        print(f"to finish, make the candidate pool the deployment's --upstream, then: draftwatch rollout abort {r.id}")
        return 0

    return run_with_engine(args, "rollout promote", action)


def _abort(args: argparse.Namespace) -> int:
    from monitor.proxy.rollout import RolloutError, abort

    def action(engine: Engine, _settings: Settings) -> int:
        try:
            r = abort(engine, args.id, datetime.now(UTC), args.reason)
        except RolloutError as error:
            print(f"draftwatch rollout abort: {error}", file=sys.stderr)
            return 2
        print(f"rollout {r.id} aborted ({r.reason}): every request of deployment {r.deployment!r} goes to the "
              "current drafter again")  # fmt: skip
        return 0

    return run_with_engine(args, "rollout abort", action)


def describe(r: Rollout) -> list[str]:
    """A rollout's lines: where it stands, then per workload the judge's newest judgement."""
    step = f"step {r.step + 1} of {len(r.steps)}"
    if r.status == "running":
        state = f"{step}: {_percent(r.step_share)} of the speculative requests to {r.drafter}"
        when = f"started {_time(r.started_at)}, this step since {_time(r.step_started_at)}"
        if r.holds:
            when += f", held {r.holds} interval(s)"
    elif r.status == "promoted":
        state = f"{r.drafter} serves {'the workloads where it passed' if r.per_workload else 'every workload'}"
        when = f"started {_time(r.started_at)}, promoted {_time(r.finished_at)}"
    else:
        state = f"ended at {step}: every request to the current drafter"
        when = f"started {_time(r.started_at)}, ended {_time(r.finished_at)}"
    lines = [
        f"rollout {r.id}  {r.status}  {state}",
        f"  drafter {r.drafter} on deployment {r.deployment!r}, steps {_percents(r.steps)}, "
        f"{_duration(r.interval_s)} a step{', per workload' if r.per_workload else ''}; {when}",
    ]
    judged: Mapping[str, Any] = r.judgement.get("workloads", {})
    names = sorted({*judged, *r.workloads})
    if not names:
        waiting = "the scheduler's rollout job judges it every scheduler.rollout_interval"
        lines.append(f"  not judged yet: {waiting}" if r.status == "running" else "  never judged")
    else:
        span = r.judgement.get("interval") or ["?", "?"]
        lines.append(f"  {'newest' if r.status == 'running' else 'last'} judgement, requests of "
                     f"{str(span[0])[:19]} .. {str(span[1])[:19]}:")  # fmt: skip
        lines.append(f"  {'workload':<16} {'outcome':<9} {'score':>5}  {'decode speed':<20} {'n cand':>7} "
                     f"{'n curr':>7} {'share':>6}  why")  # fmt: skip
        for name in names:
            lines.append("  " + _workload_row(name, judged.get(name), r))
    if r.reason and r.status != "running":  # a running one's says how it started; its events say the rest
        lines.append(f"  reason: {r.reason}")
    return lines


def _workload_row(name: str, j: Mapping[str, Any] | None, r: Rollout) -> str:
    from monitor.drift.detectors.judge import ratio_text

    side = r.workloads.get(name)
    kept = {"current": "kept on the current drafter", "candidate": "promoted"}.get(side or "", "")
    if j is None:
        return f"{name:<16.16} {'-':<9} {'-':>5}  {'-':<20} {'-':>7} {'-':>7} {_percent(r.share(name)):>6}  {kept}"
    speed = next((m for m in j.get("metrics", ()) if m.get("metric") == "decode_speed"), None)
    decode = "-" if speed is None or speed.get("ratio") is None else ratio_text(speed["ratio"], speed.get("ci"))
    score = "-" if j.get("score") is None else str(j["score"])
    why = "; ".join(part for part in (kept, j.get("reason", "") if j.get("outcome") != "pass" else "") if part)
    return (f"{name:<16.16} {j.get('outcome', '-'):<9} {score:>5}  {decode:<20} {j.get('n_candidate', 0):>7} "
            f"{j.get('n_current', 0):>7} {_percent(r.share(name)):>6}  {why}").rstrip()  # fmt: skip


def timeline(r: Rollout, events: list[RolloutEvent]) -> list[str]:
    """A rollout's events, oldest first: when, what, at which step and share, for which workload, why."""
    lines = [f"  events ({len(events)}):",
             f"  {'ts':<19}  {'kind':<11} {'step':>5} {'share':>6}  {'workload':<16} reason"]  # fmt: skip
    for e in events:
        lines.append(f"  {_time(e.ts):<19}  {e.kind:<11} {f'{e.step + 1}/{len(r.steps)}':>5} "
                     f"{_percent(e.share):>6}  {(e.workload or '-'):<16.16} {e.reason}")  # fmt: skip
    return lines


def _eta(seconds: float) -> str:
    """A time to wait, rounded up: minutes under two hours, then hours, then days."""
    if seconds < 7200:
        return f"{math.ceil(seconds / 60)}m"
    return f"{seconds / 3600:.3g}h" if seconds < 172800 else f"{seconds / 86400:.3g}d"


def _time(value: datetime | None) -> str:
    return "-" if value is None else value.isoformat()[:19]


def _percent(share: float) -> str:
    return f"{100 * share:g}%"


def _percents(steps: tuple[float, ...]) -> str:
    return ",".join(f"{100 * s:g}" for s in steps) + " %"


def _duration(seconds: float) -> str:
    return format_duration(timedelta(seconds=seconds)) if seconds == int(seconds) else f"{seconds:g}s"
