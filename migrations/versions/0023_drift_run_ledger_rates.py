"""drift_runs.ledger_rates: the ledger's rates the scheduler computed after a run, for the sidecars' counters.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-07

A nullable JSON column beside speed_split (issue 51: a sidecar no longer reads the day's ledger
itself), NULL on the runs stored before and on runs no scheduler made. A change of the catalogue only,
on PostgreSQL and SQLite.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("drift_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("ledger_rates", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("drift_runs", schema=None) as batch_op:
        batch_op.drop_column("ledger_rates")
