"""``draftwatch db upgrade | current | downgrade REV``: the schema, from the command line."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from monitor.commands.common import add_settings_arguments, run_with_engine
from monitor.config import Settings

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


def register(subparsers: Any) -> None:
    """Add the ``db`` command group to the top-level parser's subparsers."""
    parser = subparsers.add_parser("db", help="database schema: upgrade, current, downgrade")
    add_settings_arguments(parser)
    parser.set_defaults(handler=lambda _args: (parser.print_help(), 2)[1])
    commands = parser.add_subparsers(dest="db_command", metavar="DB_COMMAND")

    upgrade = commands.add_parser("upgrade", help="migrate the schema up to the newest revision (or REV)")
    upgrade.add_argument("revision", nargs="?", default="head", help="target revision (default: head)")
    upgrade.set_defaults(handler=_upgrade)

    current = commands.add_parser("current", help="print the schema revision of the database")
    current.add_argument("--json", action="store_true", help="print {current, head, up_to_date} as JSON")
    current.set_defaults(handler=_current)

    downgrade = commands.add_parser("downgrade", help="migrate the schema down to REV ('base' empties it)")
    downgrade.add_argument("revision", help="target revision, e.g. base or 0001")
    downgrade.set_defaults(handler=_downgrade)


def _run(args: argparse.Namespace, action: str) -> int:
    from monitor.store import migrate

    def act(engine: Engine, _settings: Settings) -> int:
        if action == "upgrade":
            print(f"database at revision {migrate.upgrade(engine, args.revision)}")
        elif action == "downgrade":
            print(f"database at revision {migrate.downgrade(engine, args.revision) or 'base'}")
        else:
            current, head = migrate.current_revision(engine), migrate.head_revision()
            if args.json:
                print(json.dumps({"current": current, "head": head, "up_to_date": current == head}))
                return 0
            state = "up to date" if current == head else f"newest is {head}"
            print(f"{current or 'base (empty)'} ({state})")
        return 0

    # The db commands manage the schema themselves: no automatic upgrade first.
    return run_with_engine(args, f"db {action}", act, upgrade=False)


def _upgrade(args: argparse.Namespace) -> int:
    return _run(args, "upgrade")


def _current(args: argparse.Namespace) -> int:
    return _run(args, "current")


def _downgrade(args: argparse.Namespace) -> int:
    return _run(args, "downgrade")
