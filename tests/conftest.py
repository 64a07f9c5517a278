"""Fixtures every test package shares: each storage test runs on a SQLite file and on PostgreSQL."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import Engine

from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from tests.alerting import Receiver
from tests.pg import PG_URL, create_pg_database, drop_pg_database
from tests.private_pg import PrivatePostgres
from tests.proxy.upstream import Upstream, serving


@pytest.fixture
def running_pg() -> Iterator[PrivatePostgres]:
    """A private PostgreSQL server, started, for a test to stop, freeze or kill (never the shared one)."""
    try:
        server = PrivatePostgres()
        server.start()
    except (RuntimeError, subprocess.CalledProcessError, KeyError) as error:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"cannot create a private PostgreSQL: {error}")
        pytest.skip(f"cannot create a private PostgreSQL: {error}")
    try:
        yield server
    finally:
        server.destroy()


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


@pytest.fixture
def upstream() -> Iterator[tuple[Upstream, str]]:
    """A stub serving stack (tests/proxy/upstream.py) on a free port, and its URL."""
    stub = Upstream()
    with serving(stub) as url:
        yield stub, url


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A real webhook receiver on 127.0.0.1 (tests/alerting.py), stopped after the test."""
    r = Receiver().start()
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture
def counted_clients(monkeypatch: pytest.MonkeyPatch) -> list[httpx.Client]:
    """Every ``httpx.Client`` the code under test makes, in order: real clients, each kept here as it is made."""
    made: list[httpx.Client] = []
    real = httpx.Client

    def counted(*args: Any, **kwargs: Any) -> httpx.Client:
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(httpx, "Client", counted)
    return made
