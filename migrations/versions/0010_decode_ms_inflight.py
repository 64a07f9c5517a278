"""requests.decode_ms and requests.upstream_inflight: the decode phase apart from queueing, and the load it ran at.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("decode_ms", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("upstream_inflight", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.drop_column("upstream_inflight")
        batch_op.drop_column("decode_ms")
