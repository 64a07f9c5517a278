"""``draftwatch db upgrade | current | downgrade REV``: the schema, from the command line."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from monitor.config import ConfigError, Settings, default_config_file
from monitor.db import migrate
from monitor.db.engine import create_engine

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    """Add the ``db`` command group to the top-level parser's subparsers."""
    parser = subparsers.add_parser("db", help="database schema: upgrade, current, downgrade")
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="draftwatch.toml to read (default: $DRAFTWATCH_CONFIG or ./draftwatch.toml)",
    )
    parser.add_argument("--database-url", default=None, help="overrides DRAFTWATCH_DATABASE_URL and the config file")
    parser.set_defaults(handler=lambda _args: (parser.print_help(), 2)[1])
    commands = parser.add_subparsers(dest="db_command", metavar="DB_COMMAND")

    upgrade = commands.add_parser("upgrade", help="migrate the schema up to the newest revision (or REV)")
    upgrade.add_argument("revision", nargs="?", default="head", help="target revision (default: head)")
    upgrade.set_defaults(handler=_upgrade)

    current = commands.add_parser("current", help="print the schema revision of the database")
    current.set_defaults(handler=_current)

    downgrade = commands.add_parser("downgrade", help="migrate the schema down to REV ('base' empties it)")
    downgrade.add_argument("revision", help="target revision, e.g. base or 0001")
    downgrade.set_defaults(handler=_downgrade)


def _settings(args: argparse.Namespace) -> Settings:
    config_file = args.config or default_config_file(os.environ, Path.cwd())
    settings = Settings.from_env(os.environ, config_file)
    if args.database_url:
        settings = settings.replace(database_url=args.database_url)
    return settings


def _run(args: argparse.Namespace, action: str) -> int:
    try:
        settings = _settings(args)
    except ConfigError as error:
        print(f"draftwatch: {error}", file=sys.stderr)
        return 2
    engine = create_engine(settings.database_url)
    try:
        if action == "upgrade":
            revision = migrate.upgrade(engine, args.revision)
            print(f"database at revision {revision}")
        elif action == "downgrade":
            revision = migrate.downgrade(engine, args.revision)
            print(f"database at revision {revision or 'base'}")
        else:
            current = migrate.current_revision(engine)
            head = migrate.head_revision()
            state = "up to date" if current == head else f"newest is {head}"
            print(f"{current or 'base (empty)'} ({state})")
    except Exception as error:  # the CLI reports, the log keeps the traceback
        log.debug("db %s failed", action, exc_info=True)
        print(f"draftwatch db {action}: {type(error).__name__}: {str(error).splitlines()[0]}", file=sys.stderr)
        return 1
    finally:
        engine.dispose()
    return 0


def _upgrade(args: argparse.Namespace) -> int:
    return _run(args, "upgrade")


def _current(args: argparse.Namespace) -> int:
    return _run(args, "current")


def _downgrade(args: argparse.Namespace) -> int:
    return _run(args, "downgrade")
