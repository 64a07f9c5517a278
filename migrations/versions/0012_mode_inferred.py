"""requests.mode_inferred: a plain mode read off a response without draft counts, not declared by the deployment.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05

Rows written before it were never flagged: they read as declared (false), as they were counted before.
On PostgreSQL (11 and later) a column with a constant default is added without rewriting the table.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("mode_inferred", sa.Boolean(), server_default=sa.false(), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.drop_column("mode_inferred")
