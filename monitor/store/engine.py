"""Engine creation for both supported databases.

SQLite (the embedded default) gets WAL, a busy timeout and foreign keys on every connection;
PostgreSQL goes through psycopg 3 with pre-ping, so that connections broken by a server restart are
replaced instead of failing the next batch. Both hide a statement's parameters from its errors (and
from ``echo``): they are request and record values, which logs never carry.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Engine, make_url

from monitor.settings.masking import mask_urls

log = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_MS = 30_000
POSTGRES_CONNECT_TIMEOUT_S = 5


def normalize_url(url: str | URL) -> URL:
    """Pick psycopg 3 for bare ``postgresql://`` / ``postgres://`` URLs.

    >>> normalize_url("postgres://u@h/db").render_as_string()
    'postgresql+psycopg://u@h/db'
    >>> normalize_url("sqlite:///x.db").drivername
    'sqlite'
    """
    parsed = make_url(url) if isinstance(url, str) else url
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def sqlite_path(url: str | URL) -> Path | None:
    """The file of a file-backed SQLite URL, else None (PostgreSQL, in-memory)."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


class StoreLocationError(OSError):
    """The database's file cannot be created where the URL puts it; the message says where and what to do."""


def create_engine(url: str | URL, *, echo: bool = False, **kwargs: Any) -> Engine:
    """An engine for ``url`` with draftwatch's connection settings; creates a SQLite file's directory."""
    parsed = normalize_url(url)
    backend = parsed.get_backend_name()
    kwargs.setdefault("hide_parameters", True)
    if backend == "sqlite":
        path = sqlite_path(parsed)
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise StoreLocationError(
                    f"cannot create the folder of the SQLite database {path} ({error.strerror or error}): "
                    "choose another path with --database-url or DRAFTWATCH_DATABASE_URL"
                ) from None
        connect_args = {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, **kwargs.pop("connect_args", {})}
        engine = sa_create_engine(parsed, echo=echo, connect_args=connect_args, **kwargs)
        event.listen(engine, "connect", _configure_sqlite)
    elif backend == "postgresql":
        connect_args = {"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S, **kwargs.pop("connect_args", {})}
        kwargs.setdefault("pool_pre_ping", True)
        engine = sa_create_engine(parsed, echo=echo, connect_args=connect_args, **kwargs)
    else:
        shown = mask_urls(parsed.render_as_string(hide_password=False))
        raise ValueError(f"database URL {shown!r}: only sqlite and postgresql are supported")
    log.debug("engine for %s", mask_urls(parsed.render_as_string(hide_password=True)))
    return engine


def _configure_sqlite(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        # WAL lets readers (dashboard, API) run while the recorder writes; NORMAL sync is durable
        # against a crash of the process, which is the failure the recorder promises to survive.
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def read_rows(engine: Engine | Connection, query: Any) -> list[Any]:
    """``query``'s rows, on ``engine``'s own connection or inside the caller's (its transaction, its locks)."""
    if isinstance(engine, Connection):
        return list(engine.execute(query))
    with engine.connect() as conn:
        return list(conn.execute(query))
