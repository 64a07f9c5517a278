"""``draftwatch demo``: the whole product on real models, in one command."""

from __future__ import annotations

import argparse
import signal
import tempfile
from pathlib import Path
from typing import Any, NoReturn

from decoder.extras import refuse_without


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the whole product on real models: decode, record, drift, alert, dashboard",
        description="Fetches the target, converts and quantizes it once and times the model pair, with progress "
        "in this terminal; starts the sidecar (embedded speculative decoder, holdout traffic, scheduler), a local "
        "webhook receiver and the dashboard on a fresh SQLite database; drives the built-in workloads "
        "through the HTTP API; midway changes one workload's prompts so that its acceptance falls; waits "
        "for the drift test to find it and the alert to arrive; prints a summary. Default: qwen-coder-1.5b "
        "with a portfolio of two drafters, the qwen-coder-0.5b draft model and the n-gram drafter (prompt lookup), "
        "the controller choosing per request; on a CPU the n-gram drafter pays where the draft model costs more "
        "than it saves.",
    )
    parser.add_argument("--quick", action="store_true", help="smollm2-135m with the n-gram drafter (a few minutes)")
    parser.add_argument(
        "--exit", action="store_true", help="exit after the summary (status 0 only if the alert arrived)"
    )
    parser.add_argument(
        "--dir", type=Path, default=None, help="directory for the database and logs (default: a new temp dir)"
    )
    parser.add_argument("--dashboard-port", type=int, default=None, help="dashboard port (default: a free one)")
    parser.add_argument("--no-dashboard", action="store_true", help="do not start the dashboard")
    parser.add_argument(
        "--rollout",
        action="store_true",
        help="after the alert, roll a new drafter out on the live traffic (the draft model alone; --quick: the "
        "target as its own draft), per workload, and print the judge's decisions as they come (a few minutes "
        "more; status 0 only if the rollout also ended by a decision)",
    )
    parser.set_defaults(handler=_demo)


def _stop(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt


def _demo(args: argparse.Namespace) -> int:
    if (refused := refuse_without("draftwatch demo", "decoder", "dashboard")) is not None:
        return refused
    from monitor.demo.processes import free_port
    from monitor.demo.run import run_demo
    from monitor.demo.scenario import FULL, QUICK

    signal.signal(signal.SIGTERM, _stop)  # so that `kill` also stops the children
    workdir = args.dir or Path(tempfile.mkdtemp(prefix="draftwatch-demo-"))
    return run_demo(
        QUICK if args.quick else FULL,
        workdir,
        exit_after=args.exit,
        dashboard=not args.no_dashboard,
        dashboard_port=args.dashboard_port or free_port(),
        rollout=args.rollout,
    )
