"""routing_events: every switch of a workload between the speculative pool and the plain baseline (proxy mode).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out, not imported from the models: a migration is a frozen snapshot.
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "routing_events",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("workload", sa.String(length=64), nullable=False),
        sa.Column("target_model", sa.String(length=512), nullable=False),
        sa.Column("routed", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.String(length=512), nullable=False),
        sa.Column("speedup", sa.Float(), nullable=True),
        sa.Column("ci_low", sa.Float(), nullable=True),
        sa.Column("ci_high", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_routing_events")),
    )
    op.create_index("ix_routing_events_workload_ts", "routing_events", ["workload", "ts"])


def downgrade() -> None:
    op.drop_index("ix_routing_events_workload_ts", table_name="routing_events")
    op.drop_table("routing_events")
