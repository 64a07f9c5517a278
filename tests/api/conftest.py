"""Fixtures for the API tests: the real app on a real database (SQLite file and PostgreSQL), in process.

PostgreSQL databases come from tests/conftest.py (fresh per test, dropped afterwards; a failure
under CI=true when the server is unreachable).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from decoder.record import RequestRecord
from monitor.api.app import create_app
from monitor.config import Settings
from monitor.ingest.synthetic import synthetic_record
from monitor.store.engine import create_engine
from monitor.store.models import RequestRow

INGEST = "ingest-token-0123456789"
READ = "read-token-0123456789ab"
ADMIN = "admin-token-0123456789a"
TOKENS = f"ingest:{INGEST},read:{READ},admin:{ADMIN}"


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def make_settings(tmp_path: Path, db_url: str, **env: str) -> Settings:
    """The app's settings for a test. The proxy's engine watch is off unless asked for: the stand-in engines
    note every request they get, and its reads are not the traffic a test checks (tests/proxy/test_engine_watch.py
    and the real llama-server tests turn it on)."""
    environ = {"HOME": str(tmp_path), "DRAFTWATCH_DATA_DIR": str(tmp_path / "data"), "DRAFTWATCH_API_TOKENS": TOKENS}
    environ |= {"DRAFTWATCH_DATABASE_URL": db_url, "DRAFTWATCH_DECODER_HOLDOUT_SHARE": "0"}
    environ |= {"DRAFTWATCH_PROXY_ENGINE_WATCH_S": "0", **env}
    return Settings.from_env(environ, None)


def recent(minutes: float = 5) -> datetime:
    """A minute-aligned time a little in the past: inside the default read range, never in the future."""
    return (datetime.now(UTC) - timedelta(minutes=minutes)).replace(second=0, microsecond=0)


def records(count: int, prefix: str = "r", start: datetime | None = None, **kwargs: Any) -> list[RequestRecord]:
    begin = start or recent()
    return [
        synthetic_record(
            i, workload=("code", "chat")[i % 2], prefix=prefix, start=begin, spacing=timedelta(0), **kwargs
        )
        for i in range(count)
    ]


def bodies(recs: list[RequestRecord]) -> list[dict[str, Any]]:
    return [r.to_dict() for r in recs]


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'draftwatch.db'}"


@pytest.fixture
def client(tmp_path: Path, db_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(tmp_path, db_url))) as test_client:
        yield test_client


@pytest.fixture
def count_rows(db_url: str) -> Iterator[Callable[[], int]]:
    engine = create_engine(db_url)

    def count() -> int:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(RequestRow)).scalar_one())

    yield count
    engine.dispose()


def stored(db_url: str, request_id: str) -> dict[str, Any]:
    """The stored row of ``request_id`` as a dict."""
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            row = conn.execute(select(RequestRow.__table__).where(RequestRow.request_id == request_id)).one()
            return dict(row._mapping)
    finally:
        engine.dispose()
