"""drift_runs.speed_split: each run's split of the change of decode time per token (issue 50, item 6).

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-07

A nullable JSON column beside acceptance_split, NULL on the runs stored before. A change of the
catalogue only, on PostgreSQL and SQLite.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("drift_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("speed_split", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("drift_runs", schema=None) as batch_op:
        batch_op.drop_column("speed_split")
