"""routing_events.above_inflight: the load from which a workload routed by load goes to the baseline (issue 51).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06

NULL for a workload routed whole (all but its probes) and for a switch back to speculation. A
nullable column without a default: a change of the catalogue only, on either database.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("routing_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("above_inflight", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("routing_events", schema=None) as batch_op:
        batch_op.drop_column("above_inflight")
