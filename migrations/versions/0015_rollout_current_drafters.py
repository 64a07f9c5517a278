"""rollouts.current_drafters: the names the current side's requests are stored under, for the judge to read.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06

A proxy stores its current pool's requests under ``upstream``; the embedded decoder under its
portfolio's drafter kinds (``model``, ``ngram``). Rollouts started before this were all the
proxy's: they read ``["upstream"]``, the column's default. On PostgreSQL (11 and later) a column
with a constant default is added without rewriting the table.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("rollouts", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("current_drafters", sa.JSON(), server_default=sa.text("""'["upstream"]'"""), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("rollouts", schema=None) as batch_op:
        batch_op.drop_column("current_drafters")
