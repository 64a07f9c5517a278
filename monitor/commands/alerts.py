"""``draftwatch alerts list|deliver|ack`` and ``draftwatch scheduler``."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from datetime import UTC, datetime
from typing import Any

from monitor.commands.common import add_settings_arguments, run_with_engine
from monitor.config import Settings


def register(subparsers: Any) -> None:
    """Add the ``alerts`` group and the ``scheduler`` command."""
    alerts = subparsers.add_parser("alerts", help="list and acknowledge alerts, deliver webhooks now")
    alerts.set_defaults(handler=lambda _args: (alerts.print_help(), 2)[1])
    commands = alerts.add_subparsers(dest="alerts_command", metavar="ALERTS_COMMAND")
    listing = commands.add_parser("list", help="alerts, firing first")
    add_settings_arguments(listing)
    listing.add_argument("--json", action="store_true", help="print a JSON list")
    listing.add_argument("--state", action="append", choices=["pending", "firing", "resolved", "inactive"],
                         help="only these states (repeatable; default: all)")  # fmt: skip
    listing.set_defaults(handler=_list)
    deliver = commands.add_parser("deliver", help="run one webhook delivery pass now")
    add_settings_arguments(deliver)
    deliver.set_defaults(handler=_deliver)
    ack = commands.add_parser("ack", help="acknowledge an alert: no repeated notifications this episode")
    add_settings_arguments(ack)
    ack.add_argument("id", type=int, help="alert id (see `draftwatch alerts list`)")
    ack.add_argument("--by", default=os.environ.get("USER", "cli"), help="who acknowledges (default: $USER)")
    ack.add_argument("--comment", default="", help="why")
    ack.set_defaults(handler=_ack)

    scheduler = subparsers.add_parser(
        "scheduler",
        help="run the scheduler (drift runs, alerts, webhook delivery, retention); one replica leads",
        description="Run the scheduled jobs. Any number of replicas may run against one database: a lease "
        "row elects one leader, the others stand by and take over within scheduler.lease_ttl_s.",
    )
    add_settings_arguments(scheduler)
    scheduler.add_argument("--jobs", default=None, help="comma-separated subset of drift,delivery,health,retention")
    scheduler.set_defaults(handler=_scheduler)


def _list(args: argparse.Namespace) -> int:
    from monitor.alerts.queries import list_alerts
    from monitor.store.types import iso

    def action(engine: Any, _settings: Settings) -> int:
        alerts = list_alerts(engine, args.state or ())
        if args.json:
            print(json.dumps([a.to_json() for a in alerts], indent=1))
            return 0
        print(f"{'id':>5} {'state':<9} {'severity':<9} {'rule':<22} {'workload':<14} {'since':<20} ack  summary")
        for a in alerts:
            since = (iso(a.fired_at or a.pending_since or a.resolved_at) or "")[:19]
            ack = "yes" if a.acknowledged else "-"
            workload = a.labels.get("workload", "-")
            print(f"{a.id:>5} {a.state:<9} {a.severity:<9} {a.rule:<22.22} "
                  f"{workload:<14.14} {since:<20} {ack:<4} {a.summary}")  # fmt: skip
        print(f"{len(alerts)} alert(s)")
        return 0

    return run_with_engine(args, "alerts list", action)


def _deliver(args: argparse.Namespace) -> int:
    from monitor.notify.delivery import deliver_pending

    def action(engine: Any, settings: Settings) -> int:
        r = deliver_pending(engine, settings.delivery)
        print(f"attempted {r.attempted}, delivered {r.delivered}, retried {r.retried}, dead {r.dead}, "
              f"waiting {r.waiting}")  # fmt: skip
        return 0

    return run_with_engine(args, "alerts deliver", action)


def _ack(args: argparse.Namespace) -> int:
    from monitor.alerts.queries import acknowledge

    def action(engine: Any, _settings: Settings) -> int:
        alert = acknowledge(engine, args.id, args.by, args.comment, datetime.now(UTC))
        if alert is None:
            print(f"draftwatch alerts ack: no alert {args.id}", file=sys.stderr)
            return 1
        print(f"alert {args.id} ({alert.rule}, {alert.state}): acknowledged={alert.acknowledged}")
        return 0

    return run_with_engine(args, "alerts ack", action)


def _scheduler(args: argparse.Namespace) -> int:
    from monitor.scheduler.service import SchedulerService

    def action(_engine: Any, settings: Settings) -> int:
        jobs = [j.strip() for j in args.jobs.split(",")] if args.jobs else None
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        # Its own engine, as serve's scheduler has: its statements bounded by scheduler.statement_timeout_s.
        service = SchedulerService(settings, jobs=jobs).start()
        print(f"draftwatch scheduler: {service.holder} running ({', '.join(service.jobs)})", file=sys.stderr,
              flush=True)  # fmt: skip
        try:
            stop.wait()
        finally:
            service.stop()
        return 0

    return run_with_engine(args, "scheduler", action)
