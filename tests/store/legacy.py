"""Rows written at an old revision by today's writer, which writes the columns later migrations add."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.engine import Connection

from decoder.record import RequestRecord
from monitor.store.models import RequestRow
from monitor.store.writes.writer import write_batch


def write_at_old_revision(conn: Connection, records: Sequence[RequestRecord], batch_id: str) -> None:
    """``write_batch`` on a schema from before some of ``requests``' columns: they exist for this batch only, then
    are dropped again, so that the migration that adds them finds the table as it was at that revision."""
    present = set(conn.execute(text("SELECT column_name FROM information_schema.columns WHERE table_name = 'requests'"))
                  .scalars())  # fmt: skip
    later = [column for column in RequestRow.__table__.columns if column.name not in present]
    for column in later:
        conn.execute(text(f"ALTER TABLE requests ADD COLUMN {column.name} {column.type.compile(conn.dialect)}"))
    write_batch(conn, records, batch_id, "sync")
    for column in later:
        conn.execute(text(f"ALTER TABLE requests DROP COLUMN {column.name}"))
