"""Schema migrations, run programmatically: ``upgrade`` at service start and ``draftwatch db ...``.

The Alembic configuration is built in code; ``script_location`` is the repository's ``migrations/``
directory, which a wheel carries as the package ``monitor.store.migrations`` (setup.py) and a checkout
holds next to the ``monitor`` package (:func:`migrations_dir`).
Several replicas may start at once: on PostgreSQL, :func:`upgrade` and :func:`downgrade` hold a
session-level advisory lock while Alembic runs, on SQLite an exclusive lock on a file next to the
database, so one replica migrates and the others then find the schema current. On PostgreSQL
:func:`upgrade` then makes the partitions of ``requests`` and of the rollups from today's to some days
ahead (:func:`monitor.store.partitions.ensure_all_partitions`), outside that lock and without failing
the start.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.resources
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import select, text
from sqlalchemy.engine import Connection, Engine

from monitor.store.engine import sqlite_path
from monitor.store.partitions import DEFAULT_AHEAD_DAYS, ensure_all_partitions
from monitor.store.settings import DatabaseSettings

log = logging.getLogger(__name__)

# Any fixed 64-bit number, unique to draftwatch within a PostgreSQL database ("DRFTWTCH" in ASCII).
ADVISORY_LOCK_KEY: Final = 0x4452465457544348
MIGRATIONS_PACKAGE: Final = "monitor.store.migrations"  # the checkout's migrations/, as setup.py installs it


class MigrationError(RuntimeError):
    """The migrations directory is missing or a migration failed."""


def migrations_dir() -> Path:
    """The Alembic scripts: the installed package's, else (a checkout, an older editable install) ``migrations/``
    next to ``monitor/``."""
    try:
        return Path(str(importlib.resources.files(MIGRATIONS_PACKAGE)))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config pointing at the migrations; ``connection`` is handed to env.py."""
    where = migrations_dir()
    if not (where / "env.py").is_file():
        raise MigrationError(
            f"migrations directory {where} not found: this draftwatch was installed without its migrations; "
            f"reinstall it from its wheel or sdist (it carries them as {MIGRATIONS_PACKAGE}) or from a checkout"
        )
    config = Config()
    config.set_main_option("script_location", str(where))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest revision in ``migrations/``."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise MigrationError("migrations/ holds no revision")
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, ``None`` for an empty database."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(
    engine: Engine,
    revision: str = "head",
    *,
    database: DatabaseSettings | None = None,
) -> str | None:
    """Migrate the database up to ``revision`` under the migration lock; returns the new revision.

    On PostgreSQL the partitions of ``requests`` and of the rollups are then made ahead (``database``'s
    ``partitions_ahead_days``, and its ``partition_days`` for requests; without ``database``, the
    existing partitions' width and the default days ahead). A failure there is logged, not raised:
    the default partitions take the rows meanwhile.
    """
    with _migration_lock(engine) as conn:
        before = MigrationContext.configure(conn).get_current_revision()
        command.upgrade(alembic_config(conn), revision)
        conn.commit()
        after = MigrationContext.configure(conn).get_current_revision()
    if before != after:
        log.info("database upgraded from %s to %s", before or "empty", after)
    if engine.dialect.name == "postgresql":
        try:
            ahead = DEFAULT_AHEAD_DAYS if database is None else database.partitions_ahead_days
            days = None if database is None else database.partition_days
            ensure_all_partitions(engine, datetime.now(UTC), ahead, partition_days=days)
        except Exception as error:  # the start goes on; the scheduler's retention job tries again
            log.warning("could not create the partitions ahead: %s", str(error).splitlines()[0])
    return after


def downgrade(engine: Engine, revision: str) -> str | None:
    """Migrate the database down to ``revision`` (``base`` empties it) under the migration lock."""
    with _migration_lock(engine) as conn:
        command.downgrade(alembic_config(conn), revision)
        conn.commit()
        after = MigrationContext.configure(conn).get_current_revision()
    log.info("database downgraded to %s", after or "base")
    return after


def is_current(engine: Engine) -> bool:
    """Whether the database is at the newest revision."""
    return current_revision(engine) == head_revision()


@contextlib.contextmanager
def _migration_lock(engine: Engine) -> Iterator[Connection]:
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            # Session-level lock: it outlives the transactions Alembic commits, until we unlock.
            conn.execute(select(text(f"pg_advisory_lock({ADVISORY_LOCK_KEY})")))
            conn.commit()
            try:
                yield conn
            finally:
                conn.rollback()
                conn.execute(select(text(f"pg_advisory_unlock({ADVISORY_LOCK_KEY})")))
                conn.commit()
        return
    path = sqlite_path(engine.url)
    lock_path = path.with_name(path.name + ".migrate-lock") if path is not None else None
    with contextlib.ExitStack() as stack:
        if lock_path is not None:
            handle = stack.enter_context(lock_path.open("a"))
            fcntl.flock(handle, fcntl.LOCK_EX)
        conn = stack.enter_context(engine.connect())
        yield conn
