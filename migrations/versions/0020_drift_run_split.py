"""drift_runs.acceptance_split: each run's split of the acceptance change, kept for the dashboard (issue 50).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07

A nullable JSON column, NULL on the runs stored before: their split was never kept and cannot be
recomputed from what they stored. A change of the catalogue only, on PostgreSQL and SQLite.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("drift_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("acceptance_split", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("drift_runs", schema=None) as batch_op:
        batch_op.drop_column("acceptance_split")
