"""Fixtures for the monitor tests: every storage test runs on SQLite and on PostgreSQL.

PostgreSQL is the server on 127.0.0.1:5432 (trust auth, user postgres); each test gets its own
database, dropped afterwards. Unreachable PostgreSQL skips those tests, except under CI=true,
where it is a failure.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy.engine import Engine

from monitor.db.engine import create_engine
from monitor.db.migrate import upgrade

PG_ADMIN = os.environ.get("DRAFTWATCH_TEST_PG", "host=127.0.0.1 port=5432 user=postgres dbname=postgres")
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


def _pg_unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"PostgreSQL is required under CI=true: {reason}")
    pytest.skip(f"PostgreSQL not reachable: {reason}")


def create_pg_database() -> str:
    """A fresh, empty database on the shared server; returns its name."""
    name = f"dw_test_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as error:
        _pg_unavailable(str(error).strip())
    return name


def drop_pg_database(name: str) -> None:
    with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_url() -> Iterator[str]:
    name = create_pg_database()
    try:
        yield PG_URL.format(name=name)
    finally:
        drop_pg_database(name)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An empty database, SQLite file or PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('db') / 'draftwatch.db'}"
        return
    name = create_pg_database()
    try:
        yield PG_URL.format(name=name)
    finally:
        drop_pg_database(name)


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    """An engine on a migrated database."""
    eng = create_engine(db_url)
    upgrade(eng)
    try:
        yield eng
    finally:
        eng.dispose()
