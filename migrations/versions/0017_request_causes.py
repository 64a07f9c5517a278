"""requests.replica, cached_prompt_tokens, style_hash and prompt_copy_share: what a cause of a drop needs (issue 50).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06

Four nullable columns, NULL on every row written before: nothing is backfilled, since none of them
can be known after the fact. On PostgreSQL ``ALTER TABLE ... ADD COLUMN`` on the partitioned parent
(migration 0014) adds the column to every partition, the default one included, and a nullable column
without a default is a change of the catalogue only: no rewrite, however many rows. SQLite adds them
in place too (``batch_alter_table`` only recreates the table where SQLite cannot alter it).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("replica", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("cached_prompt_tokens", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("style_hash", sa.String(length=12), nullable=True))
        batch_op.add_column(sa.Column("prompt_copy_share", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.drop_column("prompt_copy_share")
        batch_op.drop_column("style_hash")
        batch_op.drop_column("cached_prompt_tokens")
        batch_op.drop_column("replica")
