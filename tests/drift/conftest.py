"""Fixtures for the drift tests: a migrated database per test, SQLite and PostgreSQL.

PostgreSQL comes from the store tests' helpers (a fresh database on 127.0.0.1:5432, dropped
afterwards; unreachable means skip, except under CI=true where it is a failure).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from sqlalchemy.engine import Engine

from decoder.record import RequestRecord
from monitor.db.engine import create_engine
from monitor.db.migrate import upgrade
from monitor.db.writer import write_batch
from tests.monitor.conftest import PG_URL, create_pg_database, drop_pg_database


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """An engine on an empty, migrated database."""
    name = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'drift.db'}"
    else:
        name = create_pg_database()
        url = PG_URL.format(name=name)
    eng = create_engine(url)
    upgrade(eng)
    try:
        yield eng
    finally:
        eng.dispose()
        if name is not None:
            drop_pg_database(name)


def store(engine: Engine, records: Sequence[RequestRecord]) -> None:
    """Write records in one recorder batch (requests, version events, rollups)."""
    ordered = sorted(records, key=lambda r: r.ts_start)
    with engine.begin() as conn:
        write_batch(conn, ordered, f"test-{id(records)}-{len(records)}", "sync")
