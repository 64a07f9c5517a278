"""Helpers for the drift tests; the ``engine`` fixture (SQLite and PostgreSQL) is tests/conftest.py's."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.engine import Engine

from decoder.record import RequestRecord
from monitor.store.writes.writer import write_batch


def store(engine: Engine, records: Sequence[RequestRecord]) -> None:
    """Write records in one recorder batch (requests, version events, rollups)."""
    ordered = sorted(records, key=lambda r: r.ts_start)
    with engine.begin() as conn:
        write_batch(conn, ordered, f"test-{id(records)}-{len(records)}", "sync")
