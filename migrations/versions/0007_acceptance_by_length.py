"""Acceptance by length: requests.drafted_by_span / accepted_by_span, and the prompt-length bins of stored history.

The two columns hold a record's drafted and accepted tokens per output span (NULL where the source
does not know output positions, as serving stacks do not). Upgrade also fills ``rollup_bins``'
prompt-length metrics (``prompt_drafting``, ``prompt_drafted``, ``prompt_accepted``) from the
requests still stored, in the database (one grouped ``INSERT ... SELECT`` per metric), so the
breakdown covers history as far back as the requests reach; spans cannot be recovered for old rows.
Downgrade drops the columns and every by-length bin.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

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


def upgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("drafted_by_span", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("accepted_by_span", sa.JSON(), nullable=True))
    conn = op.get_bind()
    minute, bucket = MINUTE[conn.dialect.name], _bucket()
    key = "workload, target_model, drafter, COALESCE(draft_model, ''), mode"
    for metric, aggregate in PROMPT_METRICS.items():
        conn.exec_driver_sql(
            "INSERT INTO rollup_bins (bucket, workload, target_model, drafter, draft_model, mode, metric, bin, count) "
            f"SELECT {minute}, {key}, '{metric}', {bucket}, {aggregate} FROM requests "
            f"WHERE num_draft_tokens > 0 GROUP BY {minute}, {key}, {bucket}"
        )


def downgrade() -> None:
    bins = sa.table("rollup_bins", sa.column("metric", sa.String()))
    op.get_bind().execute(sa.delete(bins).where(bins.c.metric.in_(ALL_METRICS)))
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.drop_column("accepted_by_span")
        batch_op.drop_column("drafted_by_span")
