"""requests.engine_version, replica_uptime_s, uptime_from, kv_cache_use: what a replica said of itself (issue 50).

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07

Four nullable columns, NULL on every row written before (none of them can be known after the fact):
on PostgreSQL a change of the catalogue only, on the partitioned parent and so every partition
(see 0017), and in place on SQLite.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("engine_version", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("replica_uptime_s", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("uptime_from", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("kv_cache_use", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.drop_column("kv_cache_use")
        batch_op.drop_column("uptime_from")
        batch_op.drop_column("replica_uptime_s")
        batch_op.drop_column("engine_version")
