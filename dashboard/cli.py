"""``draftwatch dashboard``: the Streamlit app, headless, on the database from the settings.

Streamlit runs its own server (tornado) and re-executes the page scripts, so this command becomes
that server (it execs ``python -m streamlit run dashboard/app.py``); the database URL reaches it
through ``DRAFTWATCH_DATABASE_URL``, which the app reads like every other part.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from decoder.extras import refuse_without
from monitor.commands.common import add_settings_arguments, config_file, settings_or_report

log = logging.getLogger(__name__)

APP = Path(__file__).with_name("app.py")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "dashboard",
        help="run the Streamlit dashboard (headless; open the printed URL)",
        description="Serve the dashboard: Overview, Workload, Drift, Alerts and Pairs pages over the store given by "
        "DRAFTWATCH_DATABASE_URL (or --database-url). Login is optional, see docs/dashboard.md.",
    )
    parser.add_argument("--port", type=int, default=8501, help="port to listen on (default: %(default)s)")
    parser.add_argument(
        "--address", default="127.0.0.1", help="address to bind (default: %(default)s; 0.0.0.0 for every interface)"
    )
    add_settings_arguments(parser)
    parser.set_defaults(handler=_dashboard)


def command(port: int, address: str) -> list[str]:
    """The streamlit command line (headless, no usage statistics, no file watcher in production)."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP),
        "--server.port",
        str(port),
        "--server.address",
        address,
        "--server.headless",
        "true",
        "--server.fileWatcherType",
        "none",
        "--browser.gatherUsageStats",
        "false",
        # No "Deploy" button or developer menu: this is an operations page, not a Streamlit workspace.
        "--client.toolbarMode",
        "viewer",
    ]


def _dashboard(args: argparse.Namespace) -> int:
    if (refused := refuse_without("draftwatch dashboard", "dashboard")) is not None:
        return refused
    settings = settings_or_report(args, "dashboard")
    if settings is None:
        return 2
    env = dict(os.environ)
    env["DRAFTWATCH_DATABASE_URL"] = settings.database.url
    chosen = config_file(args)
    if chosen is not None:
        env["DRAFTWATCH_CONFIG"] = str(chosen.resolve())
    print(f"draftwatch dashboard: http://{args.address}:{args.port}/", file=sys.stderr, flush=True)
    log.info("starting streamlit on %s:%d", args.address, args.port)
    # Become the Streamlit server rather than wait for it as a child: a signal sent to this process
    # (Ctrl-C, a supervisor's SIGTERM) then reaches the server itself and leaves no orphan behind.
    argv = command(args.port, args.address)
    os.execve(argv[0], argv, env)
