"""requests partitioned by RANGE (ts_start) on PostgreSQL, when the table is empty (issue 40).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05

On PostgreSQL an empty ``requests`` is swapped for a partitioned one in this migration's
transaction: the same columns (``LIKE``, the id's sequence kept), the primary key ``(id, ts_start)``
and the unique key ``(request_id, ts_start)`` (a partitioned table's unique keys must hold its
partition key), every index the table had, re-created on the parent so that each partition gets
its own, and the default partition ``requests_default``. The partitions of days are made by
monitor/store/partitions.py at start and by the scheduler, not here.

A ``requests`` holding rows is left as it is: copying it could take hours inside this migration's
lock. ``draftwatch db partition`` converts it online (docs/postgresql.md); until then the store works
on the plain table as before. SQLite keeps its one table: nothing happens there.

The downgrade swaps a partitioned table back to the plain layout, copying its rows inside the
migration's transaction (a request id stored twice, with two starts, is kept once, its first row):
offline, and as long as the copy. On a large table run ``draftwatch db unpartition`` first, which
converts back online, in batches; the downgrade then finds the plain layout and does nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

log = logging.getLogger("monitor.store.migrate")  # Alembic loads this file under a name of its own

# Spelled out, not imported from monitor/store: a migration is a frozen snapshot.
SECONDARY_INDEXES = """
    SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i
    WHERE i.indrelid = 'requests'::regclass AND NOT i.indisprimary
      AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)
    ORDER BY i.indexrelid
"""
PARTITION_INDEXES = """
    SELECT child.relname, parent.relname FROM pg_index i
    JOIN pg_class child ON child.oid = i.indexrelid
    JOIN pg_inherits h ON h.inhrelid = i.indexrelid JOIN pg_class parent ON parent.oid = h.inhparent
    WHERE i.indrelid = 'requests_default'::regclass
"""


def _relkind(bind: sa.Connection) -> str | None:
    value = bind.execute(sa.text("SELECT relkind FROM pg_class WHERE oid = to_regclass('requests')")).scalar()
    return None if value is None else str(value)


def _swap(bind: sa.Connection, *, partitioned: bool) -> None:
    """Replace the (locked) ``requests`` by one of the other layout, same columns, rows and indexes."""
    indexes = [str(r[0]).replace(" ON ONLY ", " ON ") for r in bind.execute(sa.text(SECONDARY_INDEXES))]
    sequence = bind.execute(sa.text("SELECT pg_get_serial_sequence('requests', 'id')")).scalar()
    layout = " PARTITION BY RANGE (ts_start)" if partitioned else ""
    bind.execute(sa.text(f"CREATE TABLE requests_next (LIKE requests INCLUDING DEFAULTS){layout}"))
    if not partitioned:  # keys and indexes are built after the copy, over what it copied
        copied = bind.execute(
            sa.text("INSERT INTO requests_next SELECT DISTINCT ON (request_id) * FROM requests ORDER BY request_id, id")
        ).rowcount
        log.info("migration 0014 (down): %s rows copied into the unpartitioned requests", copied)
    if sequence is not None:  # the ids go on from where they were
        bind.execute(sa.text(f"ALTER SEQUENCE {sequence} OWNED BY requests_next.id"))
    bind.execute(sa.text("DROP TABLE requests"))
    bind.execute(sa.text("ALTER TABLE requests_next RENAME TO requests"))
    if partitioned:
        bind.execute(sa.text("ALTER TABLE requests ADD CONSTRAINT pk_requests PRIMARY KEY (id, ts_start)"))
        bind.execute(
            sa.text("ALTER TABLE requests ADD CONSTRAINT uq_requests_request_id_ts_start UNIQUE (request_id, ts_start)")
        )
    else:
        bind.execute(sa.text("ALTER TABLE requests ADD CONSTRAINT pk_requests PRIMARY KEY (id)"))
        bind.execute(sa.text("ALTER TABLE requests ADD CONSTRAINT uq_requests_request_id UNIQUE (request_id)"))
    for definition in indexes:
        if partitioned and definition.startswith("CREATE UNIQUE"):
            # Not made by draftwatch: a unique index without ts_start cannot exist on the partitioned table.
            log.warning("migration 0014: unique index left out of the partitioned requests: %s", definition)
            continue
        bind.execute(sa.text(definition))
    if partitioned:
        bind.execute(sa.text("CREATE TABLE requests_default PARTITION OF requests DEFAULT"))
        # Its indexes named after the table's (ix_requests_ts_default), as plans then say which one served.
        for child, parent in bind.execute(sa.text(PARTITION_INDEXES)).all():
            bind.execute(sa.text(f'ALTER INDEX "{child}" RENAME TO "{parent}_default"'))


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql" or _relkind(bind) != "r":
        return
    # Taken before the check, so that no row committed in between is dropped with the empty table.
    bind.execute(sa.text("LOCK TABLE requests IN ACCESS EXCLUSIVE MODE"))
    if bind.execute(sa.text("SELECT EXISTS (SELECT 1 FROM requests)")).scalar():
        # A warning: on stderr also where logging is not configured (Python's last-resort handler).
        log.warning(
            "migration 0014: requests holds rows, so it stays unpartitioned for now (converting it here could take "
            "hours under a lock); run `draftwatch db partition` to convert it online (docs/postgresql.md)"
        )
        return
    _swap(bind, partitioned=True)


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql" or _relkind(bind) != "p":
        return
    bind.execute(sa.text("LOCK TABLE requests IN ACCESS EXCLUSIVE MODE"))
    _swap(bind, partitioned=False)
