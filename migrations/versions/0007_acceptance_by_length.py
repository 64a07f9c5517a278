"""Acceptance by length: requests.drafted_by_span / accepted_by_span, and the prompt-length bins of stored history.

The two columns hold a record's drafted and accepted tokens per output span (NULL where the source
does not know output positions, as serving stacks do not). Upgrade also fills ``rollup_bins``'
prompt-length metrics (``prompt_drafting``, ``prompt_drafted``, ``prompt_accepted``) from the
requests still stored, in the database (grouped ``INSERT ... SELECT``), so the breakdown covers
history as far back as the requests reach; spans cannot be recovered for old rows. On PostgreSQL
the columns are added and committed first, and the history is filled a day at a time, each day
its own transaction: in one transaction the ``ALTER TABLE``'s exclusive lock on ``requests`` was
held for the whole fill, which stopped ingest for about 20 minutes on 10 million requests
(benchmarks/store_scale.py). An interrupted fill resumes where it stopped when upgrade runs again.
Downgrade drops the columns and every by-length bin.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out, not imported: a migration is a frozen snapshot of the definitions of its day.
PROMPT_EDGES = (256, 1024, 4096)
PROMPT_METRICS = {
    "prompt_drafting": "COUNT(*)",
    "prompt_drafted": "SUM(num_draft_tokens)",
    "prompt_accepted": "SUM(num_accepted_tokens)",
}
ALL_METRICS = (*PROMPT_METRICS, "span_drafting", "span_drafted", "span_accepted")
# The rollup bucket of a request, in each dialect's stored form: SQLite keeps naive UTC text
# ('2026-01-01 12:34:00.000000', SQLAlchemy's format), PostgreSQL a timestamptz.
MINUTE = {
    "sqlite": "strftime('%Y-%m-%d %H:%M:00.000000', ts_start)",
    "postgresql": "date_trunc('minute', ts_start AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'",
}


def _bucket() -> str:
    whens = " ".join(f"WHEN prompt_tokens < {edge} THEN {i}" for i, edge in enumerate(PROMPT_EDGES))
    return f"CASE {whens} ELSE {len(PROMPT_EDGES)} END"


def _fill(conn: sa.Connection, where: str = "", **bounds: object) -> None:
    """Insert the prompt-length bins of the drafting requests that ``where`` selects (none already there)."""
    minute, bucket = MINUTE[conn.dialect.name], _bucket()
    key = "workload, target_model, drafter, COALESCE(draft_model, ''), mode"
    for metric, aggregate in PROMPT_METRICS.items():
        conn.execute(
            sa.text(
                "INSERT INTO rollup_bins (bucket, workload, target_model, drafter, draft_model, mode, metric, bin, "
                f"count) SELECT {minute}, {key}, '{metric}', {bucket}, {aggregate} FROM requests "
                f"WHERE num_draft_tokens > 0 {where} GROUP BY {minute}, {key}, {bucket} ON CONFLICT DO NOTHING"
            ),
            bounds,
        )


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        with op.batch_alter_table("requests", schema=None) as batch_op:
            batch_op.add_column(sa.Column("drafted_by_span", sa.JSON(), nullable=True))
            batch_op.add_column(sa.Column("accepted_by_span", sa.JSON(), nullable=True))
        _fill(conn)
        return
    for column in ("drafted_by_span", "accepted_by_span"):
        op.execute(f"ALTER TABLE requests ADD COLUMN IF NOT EXISTS {column} JSON")
    # monitor.store.migrate hands over a connection whose transaction it commits: committing here
    # releases the ALTER's lock, and each day's fill after it is a transaction of its own.
    conn.commit()
    first, last = conn.execute(
        sa.text("SELECT min(ts_start), max(ts_start) FROM requests WHERE num_draft_tokens > 0")
    ).one()
    if first is None:
        return
    day = first.replace(hour=0, minute=0, second=0, microsecond=0)
    while day <= last:
        _fill(conn, "AND ts_start >= :start AND ts_start < :end", start=day, end=day + timedelta(days=1))
        conn.commit()
        day += timedelta(days=1)


def downgrade() -> None:
    bins = sa.table("rollup_bins", sa.column("metric", sa.String()))
    op.get_bind().execute(sa.delete(bins).where(bins.c.metric.in_(ALL_METRICS)))
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.drop_column("accepted_by_span")
        batch_op.drop_column("drafted_by_span")
