"""``draftwatch db upgrade | current | downgrade REV | partition | unpartition``: the schema, from the command line.

``partition`` converts PostgreSQL tables that held rows when their partitioning migration ran
(``requests``: 0014; ``rollup_minute`` and ``rollup_bins``: 0016) to the partitioned layout online,
``unpartition`` back (monitor/store/repartition.py, docs/postgresql.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from monitor.commands.common import add_settings_arguments, run_with_engine
from monitor.config import Settings

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from monitor.store.repartition import Progress


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

    for name, layout in (("partition", "partitioned by time"), ("unpartition", "unpartitioned (the way back)")):
        convert = commands.add_parser(
            name,
            help=f"PostgreSQL: convert requests and the rollups to the {layout} layout online, in batches, resumable",
            description=f"Convert requests, rollup_minute and rollup_bins to the {layout} layout while the "
            "services run, one table after the other: a new table beside it, the rows copied in batches by time "
            "(run again to go on after an interruption), the rows written meanwhile copied by triggers, then one "
            "short swap. docs/postgresql.md tells the whole story.",
        )
        convert.add_argument("--batch-rows", type=int, default=50_000, help="rows copied per transaction (about)")
        convert.add_argument("--max-batches", type=int, default=None, help="stop after so many batches (resume later)")
        convert.add_argument("--keep-old", action="store_true", help="keep each old table as TABLE_old after it")
        convert.add_argument("--abort", action="store_true", help="abandon the conversions under way (drops their "
                             "new tables)")  # fmt: skip
        convert.set_defaults(handler=_partition if name == "partition" else _unpartition)


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


def _partition(args: argparse.Namespace) -> int:
    return _convert(args, partitioned=True)


def _unpartition(args: argparse.Namespace) -> int:
    return _convert(args, partitioned=False)


def _convert(args: argparse.Namespace, *, partitioned: bool) -> int:
    command = "db partition" if partitioned else "db unpartition"

    def act(engine: Engine, settings: Settings) -> int:
        from monitor.store import migrate, repartition

        if engine.dialect.name != "postgresql":
            print(f"draftwatch {command}: only PostgreSQL partitions tables; SQLite keeps one table each",
                  file=sys.stderr)  # fmt: skip
            return 1
        if args.abort:
            abandoned = repartition.abort(engine)
            print(f"conversion of {', '.join(abandoned)} abandoned" if abandoned else "no conversion under way")
            return 0
        if not migrate.is_current(engine):
            print(f"draftwatch {command}: the schema is not at the newest revision: run draftwatch db upgrade first",
                  file=sys.stderr)  # fmt: skip
            return 1
        outcome = repartition.convert(
            engine,
            partitioned=partitioned,
            partition_days=settings.database.partition_days,
            ahead_days=settings.database.partitions_ahead_days,
            batch_rows=args.batch_rows,
            max_batches=args.max_batches,
            keep_old=args.keep_old,
            progress=_Reporter(),
        )
        layout = "partitioned" if partitioned else "unpartitioned"
        if outcome.state == "already":
            print(f"{', '.join(repartition.ALL_TABLES)} are already {layout}: nothing to do")
        elif outcome.state == "paused":
            print(f"paused in {outcome.tables[0]} after {outcome.batches} batches ({outcome.rows_copied:,} rows): "
                  f"run {command} again")  # fmt: skip
        else:
            print(f"{', '.join(outcome.tables)} now {layout} ({outcome.rows_copied:,} rows copied in this run)")
        return 0

    return run_with_engine(args, command, act, upgrade=False)


class _Reporter:
    """Progress on the terminal: a line per table rewritten in place on a TTY, a line every 10 s otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.last = 0.0
        self.table: str | None = None

    def __call__(self, progress: Progress) -> None:
        now = time.monotonic()
        changed = progress.table != self.table
        if now - self.last < (0.5 if self.tty else 10.0) and progress.fraction < 1 and not changed:
            return
        if self.tty and changed and self.table is not None:
            print()  # the last table's line stays
        self.last, self.table = now, progress.table
        print(("\r" if self.tty else "") + progress.line(), end="" if self.tty else "\n", flush=True)
