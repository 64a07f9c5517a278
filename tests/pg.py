"""The PostgreSQL server the tests use: 127.0.0.1:5432 (trust auth, user postgres), a fresh database
per test, dropped afterwards. Unreachable PostgreSQL skips, except under CI=true, where it fails.
"""

from __future__ import annotations

import os
import uuid

import psycopg
import pytest

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
