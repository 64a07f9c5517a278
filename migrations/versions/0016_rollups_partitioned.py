"""rollup_minute and rollup_bins partitioned by RANGE (bucket) on PostgreSQL, when empty (issue 40).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06

The rollups outgrow requests: at a million requests a day, 2.5 million rows of ``rollup_bins`` a
day (633 MB) and about 110,000 of ``rollup_minute``, kept ``retention.rollups_days`` (400 by
default). As migration 0014 did for requests, on PostgreSQL each empty rollup table is swapped for
a partitioned one in this migration's transaction: the same columns (``LIKE``, the id's sequence
kept), the primary key ``(id, bucket)`` (a partitioned table's unique keys must hold its partition
key; the rollup key ``uq_..._key`` holds it already, unchanged), every index the table had,
re-created on the parent so that each partition gets its own, and the default partition
(``rollup_minute_default``). The partitions of weeks are made by monitor/store/partitions.py at
start and by the scheduler, not here.

A rollup table holding rows is left as it is, with a warning: copying it could take hours inside
this migration's lock. ``draftwatch db partition`` converts it online (docs/postgresql.md); until
then the store works on the plain table as before. SQLite keeps its tables: nothing happens there.

The downgrade swaps a partitioned rollup table back to the plain layout, copying its rows inside the
migration's transaction: offline, and as long as the copy. On a large table run ``draftwatch db
unpartition`` first, which converts back online, in batches; the downgrade then finds the plain
layout and does nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

log = logging.getLogger("monitor.store.migrate")  # Alembic loads this file under a name of its own

# Spelled out, not imported from monitor/store: a migration is a frozen snapshot.
ROLLUP_KEY = "bucket, workload, target_model, drafter, draft_model, mode"
UNIQUE_KEYS = {"rollup_minute": ROLLUP_KEY, "rollup_bins": f"{ROLLUP_KEY}, metric, bin"}
SECONDARY_INDEXES = """
    SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i
    WHERE i.indrelid = to_regclass(:table) AND NOT i.indisprimary
      AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)
    ORDER BY i.indexrelid
"""
PARTITION_INDEXES = """
    SELECT child.relname, parent.relname FROM pg_index i
    JOIN pg_class child ON child.oid = i.indexrelid
    JOIN pg_inherits h ON h.inhrelid = i.indexrelid JOIN pg_class parent ON parent.oid = h.inhparent
    WHERE i.indrelid = to_regclass(:partition)
"""


def _relkind(bind: sa.Connection, table: str) -> str | None:
    value = bind.execute(sa.text("SELECT relkind FROM pg_class WHERE oid = to_regclass(:t)"), {"t": table}).scalar()
    return None if value is None else str(value)


def _swap(bind: sa.Connection, table: str, *, partitioned: bool) -> None:
    """Replace the (locked) ``table`` by one of the other layout, same columns, rows and indexes."""
    indexes = [
        str(r[0]).replace(" ON ONLY ", " ON ") for r in bind.execute(sa.text(SECONDARY_INDEXES), {"table": table})
    ]
    sequence = bind.execute(sa.text(f"SELECT pg_get_serial_sequence('{table}', 'id')")).scalar()
    layout = " PARTITION BY RANGE (bucket)" if partitioned else ""
    bind.execute(sa.text(f"CREATE TABLE {table}_next (LIKE {table} INCLUDING DEFAULTS){layout}"))
    if not partitioned:  # keys and indexes are built after the copy, over what it copied
        copied = bind.execute(sa.text(f"INSERT INTO {table}_next SELECT * FROM {table}")).rowcount
        log.info("migration 0016 (down): %s rows copied into the unpartitioned %s", copied, table)
    if sequence is not None:  # the ids go on from where they were
        bind.execute(sa.text(f"ALTER SEQUENCE {sequence} OWNED BY {table}_next.id"))
    bind.execute(sa.text(f"DROP TABLE {table}"))
    bind.execute(sa.text(f"ALTER TABLE {table}_next RENAME TO {table}"))
    primary = "id, bucket" if partitioned else "id"
    bind.execute(sa.text(f"ALTER TABLE {table} ADD CONSTRAINT pk_{table} PRIMARY KEY ({primary})"))
    bind.execute(sa.text(f"ALTER TABLE {table} ADD CONSTRAINT uq_{table}_key UNIQUE ({UNIQUE_KEYS[table]})"))
    for definition in indexes:
        if partitioned and definition.startswith("CREATE UNIQUE"):
            # Not made by draftwatch: a unique index without bucket cannot exist on the partitioned table.
            log.warning("migration 0016: unique index left out of the partitioned %s: %s", table, definition)
            continue
        bind.execute(sa.text(definition))
    if partitioned:
        bind.execute(sa.text(f"CREATE TABLE {table}_default PARTITION OF {table} DEFAULT"))
        # Its indexes named after the table's (ix_rollup_minute_workload_bucket_default), as plans then say which.
        for child, parent in bind.execute(sa.text(PARTITION_INDEXES), {"partition": f"{table}_default"}).all():
            bind.execute(sa.text(f'ALTER INDEX "{child}" RENAME TO "{parent}_default"'))


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    for table in UNIQUE_KEYS:
        if _relkind(bind, table) != "r":
            continue
        # Taken before the check, so that no row committed in between is dropped with the empty table.
        bind.execute(sa.text(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
        if bind.execute(sa.text(f"SELECT EXISTS (SELECT 1 FROM {table})")).scalar():
            # A warning: on stderr also where logging is not configured (Python's last-resort handler).
            log.warning(
                "migration 0016: %s holds rows, so it stays unpartitioned for now (converting it here could take "
                "hours under a lock); run `draftwatch db partition` to convert it online (docs/postgresql.md)",
                table,
            )
            continue
        _swap(bind, table, partitioned=True)


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    for table in UNIQUE_KEYS:
        if _relkind(bind, table) != "p":
            continue
        bind.execute(sa.text(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
        _swap(bind, table, partitioned=False)
